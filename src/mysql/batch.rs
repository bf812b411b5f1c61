//! The driver's text queries of several statements, one round trip each: the claim that
//! begins a request's transaction and holds its key, the completion that writes the record
//! and commits, and lease mode's acquisition and completion. They are the statements of
//! [`sql`] with their `?` parameters inlined as literals — bytes as hex (`X'..'`), text as
//! hex with its character set (`_utf8mb4 X'..'`), numbers as digits — so no text of a
//! request is ever spliced into SQL. Each stops at its first error. None commits: the
//! commit is a round trip of its own ([`sql::COMMIT_AND_RESTORE`] says why).

use std::fmt::Write as _;
use std::time::Duration;

use ::sqlx::mysql::{MySql, MySqlArguments};
use ::sqlx::query::Query;

use super::conn::{Server, micros};
use super::sql;
use crate::engine::record::{LeaseEnd, NewRecord};

/// Records whose headers and body together are larger than this are written with a bound
/// statement instead (hex doubles their size, and a text query must fit the server's
/// `max_allowed_packet`).
pub(super) const INLINE_LIMIT: usize = 1 << 20;

/// A value for one `?` of a statement.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'a> {
    Bytes(&'a [u8]),
    Text(Option<&'a str>),
    Int(Option<i64>),
    Bool(bool),
    /// An SQL expression of the crate's own, such as `LAST_INSERT_ID()`.
    Sql(&'static str),
}

impl Value<'_> {
    fn write(self, out: &mut String) {
        match self {
            Self::Bytes(bytes) => hex(out, bytes),
            Self::Text(Some(text)) => {
                out.push_str("_utf8mb4 ");
                hex(out, text.as_bytes());
            }
            Self::Text(None) | Self::Int(None) => out.push_str("NULL"),
            Self::Int(Some(n)) => {
                let _ = write!(out, "{n}");
            }
            Self::Bool(b) => out.push_str(if b { "TRUE" } else { "FALSE" }),
            Self::Sql(sql) => out.push_str(sql),
        }
    }
}

/// `query` with `values` bound to its parameters, in order: the same values as inlined, for
/// a record too large to inline. (A [`Value::Sql`] has no bound form; no bound statement
/// takes one.)
pub(super) fn bind<'q>(
    mut query: Query<'q, MySql, MySqlArguments>,
    values: &[Value<'_>],
) -> Query<'q, MySql, MySqlArguments> {
    for value in values {
        query = match *value {
            Value::Bytes(bytes) => query.bind(bytes),
            Value::Text(text) => query.bind(text),
            Value::Int(n) => query.bind(n),
            Value::Bool(b) => query.bind(b),
            Value::Sql(sql) => unreachable!("an SQL expression has no bound form: {sql}"),
        };
    }
    query
}

/// `X'…'`: `bytes` as a binary string literal.
fn hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2 + 3);
    out.push_str("X'");
    for byte in bytes {
        let _ = write!(out, "{byte:02X}");
    }
    out.push('\'');
}

/// Appends `; ` (unless `out` is empty) and `statement` with its `?`s replaced, in order, by
/// `values`. The crate's statements have no `?` but their parameters.
fn push(out: &mut String, statement: &str, values: &[Value<'_>]) {
    if !out.is_empty() {
        out.push_str("; ");
    }
    let mut values = values.iter();
    for (i, part) in statement.split('?').enumerate() {
        if i > 0 {
            values
                .next()
                .expect("a value for every parameter")
                .write(out);
        }
        out.push_str(part);
    }
    assert!(values.next().is_none(), "a parameter for every value");
}

/// The claim of a new key: the transaction begun, the key held, the placeholder inserted
/// (InnoDB holds it locked until the transaction ends, so a twin waits for it or is
/// refused), the savepoint a stored 4xx rolls back to. Its errors: 1205 or 3572 (a twin
/// holds the key), 1062 (the key has a record the look-up did not see). `wait`: how long
/// a twin may wait for the key, in whole seconds (`None`: refused at once).
///
/// On MariaDB the placeholder's insert is the lock: it waits at most `wait` (0: refused at
/// once) through `SET STATEMENT`, and the session's timeout is never touched. On MySQL,
/// whose lock wait timeout cannot be 0, the key's locking read (`NOWAIT`, or `FOR UPDATE`
/// bounded by the session's timeout, set for the claim and restored before the handler)
/// comes first. On a Galera node that read first waits until the node has applied what the
/// cluster committed before it ([`sql::CAUSAL_READS`]), so a record committed on another
/// node is seen (1062 at the placeholder, then the replay) instead of a twin that loses at
/// certification.
pub(super) fn claim(id: &[u8], fingerprint: &[u8], wait: Option<u64>, server: Server) -> String {
    let mut query = String::new();
    let placeholder = [Value::Bytes(id), Value::Bytes(fingerprint)];
    if server.mariadb && !server.galera {
        push(&mut query, sql::BEGIN_MARIADB, &[]);
        let insert = format!(
            "SET STATEMENT innodb_lock_wait_timeout = {} FOR {}",
            wait.unwrap_or(0),
            sql::INSERT_PLACEHOLDER
        );
        push(&mut query, &insert, &placeholder);
        push(&mut query, sql::SAVEPOINT, &[]);
        return query;
    }
    if server.galera {
        push(&mut query, sql::CAUSAL_READS, &[]);
    }
    push(&mut query, &sql::begin(Some(wait.unwrap_or(1)), false), &[]);
    let lock = if wait.is_some() {
        sql::LOCK_WAIT
    } else {
        sql::LOCK_NOWAIT
    };
    push(&mut query, lock, &[Value::Bytes(id)]);
    if server.galera {
        push(&mut query, sql::RESTORE_SYNC_WAIT, &[]);
    }
    push(&mut query, sql::INSERT_PLACEHOLDER, &placeholder);
    push(&mut query, sql::WORK_SAVEPOINT, &[]);
    query
}

/// The claim of a key whose replaceable record the claim found under its lock: the record
/// deleted, the placeholder inserted, the savepoint taken (and on MySQL the lock wait
/// timeout restored), each lock wait bounded to one second.
pub(super) fn replace(id: &[u8], fingerprint: &[u8], server: Server) -> String {
    let mut query = String::new();
    let placeholder = [Value::Bytes(id), Value::Bytes(fingerprint)];
    if server.mariadb && !server.galera {
        let bounded = "SET STATEMENT innodb_lock_wait_timeout = 1 FOR ";
        push(
            &mut query,
            &format!("{bounded}{}", sql::DELETE_REPLACEABLE),
            &[Value::Bytes(id)],
        );
        push(
            &mut query,
            &format!("{bounded}{}", sql::INSERT_PLACEHOLDER),
            &placeholder,
        );
        push(&mut query, sql::SAVEPOINT, &[]);
        return query;
    }
    push(&mut query, sql::DELETE_REPLACEABLE, &[Value::Bytes(id)]);
    push(&mut query, sql::INSERT_PLACEHOLDER, &placeholder);
    push(&mut query, sql::WORK_SAVEPOINT, &[]);
    query
}

/// The values of [`sql::COMPLETE`].
pub(super) fn complete_values<'a>(record: &'a NewRecord<'_>) -> [Value<'a>; 9] {
    [
        Value::Text(Some(record.scope)),
        Value::Text(record.raw_key),
        Value::Bytes(&record.fingerprint.0),
        Value::Int(Some(i64::from(record.status.as_u16()))),
        Value::Bytes(&record.headers),
        Value::Bytes(&record.body.bytes),
        Value::Int(record.body.key_id.map(i64::from)),
        Value::Int(Some(micros(record.ttl))),
        Value::Bytes(record.id.as_bytes()),
    ]
}

/// The completion before its commit: the savepoint check (`RELEASE SAVEPOINT`, or for a
/// stored 4xx the rollback to it: either fails with 1305 when the transaction is gone) and
/// the placeholder turned into the record (the query's only changed row). `None`: the
/// record is too large to inline; see [`INLINE_LIMIT`].
pub(super) fn complete(record: &NewRecord<'_>, discard_handler_writes: bool) -> Option<String> {
    let size = record.headers.len() + record.body.bytes.len();
    if size > INLINE_LIMIT {
        return None;
    }
    let mut query = String::with_capacity(1024 + 2 * (size + record.scope.len()));
    let check = if discard_handler_writes {
        sql::ROLLBACK_WORK
    } else {
        sql::RELEASE_WORK
    };
    push(&mut query, check, &[]);
    push(&mut query, sql::COMPLETE, &complete_values(record));
    Some(query)
}

/// Lease mode's acquisition of a free key, before its commit: the transaction begun, the
/// key's locking read (its row, if any, is the answer's only row), a fencing token drawn
/// from the counter (the statement's `last_insert_id`), and the PROCESSING record inserted
/// under it; every lock wait bounded to one second (on MariaDB per statement, elsewhere by
/// the session's timeout, restored at the end). A key with a record stops it at the insert
/// (1062) with the row read and locked.
pub(super) fn lease_acquire(record: &NewRecord<'_>, lease: Duration, server: Server) -> String {
    let id = record.id.as_bytes();
    let lean = server.mariadb && !server.galera;
    let bounded = |statement: &str| {
        if lean {
            format!("SET STATEMENT innodb_lock_wait_timeout = 1 FOR {statement}")
        } else {
            statement.to_owned()
        }
    };
    let mut query = if lean {
        sql::BEGIN_MARIADB.to_owned()
    } else {
        sql::begin(Some(1), false)
    };
    push(
        &mut query,
        &bounded(sql::LEASE_LOCK),
        &[Value::Bytes(&record.fingerprint.0), Value::Bytes(id)],
    );
    push(&mut query, &bounded(sql::NEXT_FENCING_TOKEN), &[]);
    push(
        &mut query,
        &bounded(sql::LEASE_INSERT),
        &[
            Value::Bytes(id),
            Value::Text(Some(record.scope)),
            Value::Text(record.raw_key),
            Value::Bytes(&record.fingerprint.0),
            // NULL, refused by the column, unless the counter's row was there to draw from.
            Value::Sql("IF(ROW_COUNT() = 1, LAST_INSERT_ID(), NULL)"),
            Value::Int(Some(micros(lease))),
            Value::Int(Some(micros(record.ttl))),
        ],
    );
    if !lean {
        push(&mut query, sql::RESTORE_LOCK_WAIT, &[]);
    }
    query
}

/// Lease mode's takeover, in the transaction [`lease_acquire`] left open on a replaceable
/// record, before its commit: the record taken over under `token`, and the token it holds
/// read back (its only row).
pub(super) fn lease_take_over(record: &NewRecord<'_>, lease: Duration, token: i64) -> String {
    let id = record.id.as_bytes();
    let mut query = String::new();
    push(
        &mut query,
        sql::LEASE_TAKE_OVER,
        &[
            Value::Text(Some(record.scope)),
            Value::Text(record.raw_key),
            Value::Bytes(&record.fingerprint.0),
            Value::Int(Some(token)),
            Value::Int(Some(micros(lease))),
            Value::Int(Some(micros(record.ttl))),
            Value::Bytes(id),
        ],
    );
    push(&mut query, sql::LEASE_TOKEN, &[Value::Bytes(id)]);
    query
}

/// Lease mode's fenced completion, its lock wait bounded to one second: one changed row if
/// the lease was still the holder's. On MariaDB it is one autocommit statement (committed
/// alone); elsewhere a transaction whose commit follows on its own. `None`: too large to
/// inline.
/// The values of [`sql::LEASE_COMPLETE`].
pub(super) fn lease_complete_values<'a>(
    record: &'a NewRecord<'_>,
    token: i64,
    end: LeaseEnd,
) -> [Value<'a>; 9] {
    [
        Value::Text(Some(end.state())),
        Value::Bool(end.retryable()),
        Value::Int(Some(i64::from(record.status.as_u16()))),
        Value::Bytes(&record.headers),
        Value::Bytes(&record.body.bytes),
        Value::Int(record.body.key_id.map(i64::from)),
        Value::Int(Some(micros(record.ttl))),
        Value::Bytes(record.id.as_bytes()),
        Value::Int(Some(token)),
    ]
}

pub(super) fn lease_complete(
    record: &NewRecord<'_>,
    token: i64,
    end: LeaseEnd,
    server: Server,
) -> Option<String> {
    let size = record.headers.len() + record.body.bytes.len();
    if size > INLINE_LIMIT {
        return None;
    }
    let lean = server.mariadb && !server.galera;
    let mut query = String::with_capacity(1024 + 2 * size);
    let update = if lean {
        format!(
            "SET STATEMENT innodb_lock_wait_timeout = 1 FOR {}",
            sql::LEASE_COMPLETE
        )
    } else {
        query.push_str(&sql::begin(Some(1), false));
        sql::LEASE_COMPLETE.to_owned()
    };
    push(
        &mut query,
        &update,
        &lease_complete_values(record, token, end),
    );
    if !lean {
        push(&mut query, sql::RESTORE_LOCK_WAIT, &[]);
    }
    Some(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_literals_and_never_the_text_itself() {
        let mut out = String::new();
        push(
            &mut out,
            "SELECT ?, ?, ?, ?, ?",
            &[
                Value::Text(Some("a'); DROP TABLE x; --")),
                Value::Bytes(&[0, 0xab, 0xff]),
                Value::Bytes(&[]),
                Value::Int(None),
                Value::Bool(true),
            ],
        );
        assert!(!out.contains("DROP"));
        assert!(out.starts_with("SELECT _utf8mb4 X'6127293B2044524F50"));
        assert!(out.ends_with(", X'00ABFF', X'', NULL, TRUE"));
        push(&mut out, "SELECT 1", &[]);
        assert!(out.ends_with("TRUE; SELECT 1"));
    }

    #[test]
    #[should_panic(expected = "a value for every parameter")]
    fn a_missing_value_is_a_bug_caught_at_once() {
        push(&mut String::new(), "SELECT ?", &[]);
    }

    const MYSQL: Server = Server {
        mariadb: false,
        galera: false,
    };
    const MARIADB: Server = Server {
        mariadb: true,
        galera: false,
    };
    const GALERA: Server = Server {
        mariadb: true,
        galera: true,
    };

    #[test]
    fn the_claim_stops_before_the_placeholder_when_the_lock_is_refused() {
        let query = claim(&[1; 16], &[2; 32], None, MYSQL);
        let lock = query.find("FOR UPDATE NOWAIT").unwrap();
        let insert = query.find("INSERT INTO idempotency_records").unwrap();
        let savepoint = query.find("SAVEPOINT axum_idempotency_work").unwrap();
        assert!(query.find("START TRANSACTION").unwrap() < lock);
        assert!(lock < insert && insert < savepoint);
        assert!(!query.contains('?'));
        assert!(claim(&[1; 16], &[2; 32], Some(3), MYSQL).contains("innodb_lock_wait_timeout = 3"));
        let causal = claim(&[1; 16], &[2; 32], None, GALERA);
        let waits = causal.find("wsrep_sync_wait = 1").unwrap();
        let restored = causal.rfind("SESSION wsrep_sync_wait = COALESCE").unwrap();
        assert!(waits < causal.find("FOR UPDATE").unwrap());
        assert!(restored < causal.find("INSERT INTO").unwrap());
    }

    #[test]
    fn on_mariadb_the_placeholder_is_the_lock_and_bounds_its_own_wait() {
        let query = claim(&[1; 16], &[2; 32], None, MARIADB);
        assert!(!query.contains("FOR UPDATE"));
        assert!(!query.contains("@axum_idempotency_lock_wait"));
        assert!(query.contains(
            "START TRANSACTION; SET STATEMENT innodb_lock_wait_timeout = 0 FOR INSERT INTO"
        ));
        assert!(query.ends_with("; SAVEPOINT axum_idempotency_work"));
        assert!(claim(&[1; 16], &[2; 32], Some(2), MARIADB).contains("timeout = 2 FOR INSERT"));
        let replace = replace(&[1; 16], &[2; 32], MARIADB);
        assert_eq!(
            replace.matches("innodb_lock_wait_timeout = 1 FOR ").count(),
            2
        );
    }
}
