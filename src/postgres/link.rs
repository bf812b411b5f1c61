//! Dead links: the TCP settings that make a connection whose peer vanished fail in
//! seconds instead of minutes.

use std::time::Duration;

use tokio_postgres::Config;

/// How soon the outbox relay's `LISTEN` connection notices a dead link when its config
/// sets no `tcp_user_timeout` of its own ([`Listener::postgres`](crate::outbox::Listener::postgres)).
pub const DEAD_LISTENER_AFTER: Duration = Duration::from_secs(10);

/// Sets the TCP timeouts on `config` that bound how long a connection waits on a peer that
/// went silent — a cut link that drops packets and sends nothing back (a switch, a
/// security group, a NAT table) — to about `within`, and returns `config`.
///
/// Without them a statement sent into a silent link waits out the kernel's retransmission
/// backoff (25 s, then 51 s, up to about 15 minutes), an idle pooled connection stays in
/// the pool looking healthy (tokio-postgres' keepalive starts after 2 hours), and a new
/// connection waits for the operating system's connect timeout. With them:
///
/// | setting | value | what it bounds |
/// |---|---|---|
/// | `tcp_user_timeout` | `within` | how long sent data (a statement, a `COMMIT`) may stay unacknowledged before the connection fails |
/// | `keepalives`, `keepalives_idle`, `keepalives_interval`, `keepalives_retries` | on, `within / 2` (at least 1 s), 1 s, 3 | how soon an idle connection finds its peer gone, so the pool discards it before handing it out |
/// | `connect_timeout` | `within` | how long a new connection waits for the server |
///
/// A statement in flight when the link is cut then fails after about `within` and its
/// request is answered 503 `store_unavailable` (or `commit_failed` for a `COMMIT` whose
/// outcome is unknown) with `Retry-After`; the failed connection is closed, so the pool
/// does not hand it out again, and requests after the link returns get fresh connections at
/// once. Give the pool timeouts of the same order too (deadpool: `wait_timeout`,
/// `create_timeout` with a runtime; bb8: `connection_timeout`), so a request never waits
/// longer for a connection than for an answer. The server keeps a vanished client's locks
/// until it notices: set PostgreSQL's `tcp_user_timeout` and `tcp_keepalives_*` there too
/// (see the operations guide).
///
/// The timeouts count unacknowledged bytes and silent peers, not slow queries: a query
/// that runs for minutes on a healthy link keeps its connection, since the server's
/// kernel acknowledges what it received and answers the keepalive probes.
///
/// ```
/// use std::time::Duration;
/// use axum_idempotency::postgres::{detect_dead_peers, tokio_postgres::Config};
///
/// let mut config: Config = "postgres://postgres@db.internal:5432/shop".parse().unwrap();
/// detect_dead_peers(&mut config, Duration::from_secs(4));
/// assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
/// assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(4)));
/// assert!(config.get_keepalives());
/// ```
pub fn detect_dead_peers(config: &mut Config, within: Duration) -> &mut Config {
    let within = within.max(Duration::from_secs(1));
    config
        .tcp_user_timeout(within)
        .keepalives(true)
        .keepalives_idle((within / 2).max(Duration::from_secs(1)))
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(3)
        .connect_timeout(within)
}
