//! What the benchmarks share: a schema of their own with the crate migrated and an
//! `orders` table, a record id type both drivers can bind, and the statements the
//! database-alone runs send. Each benchmark uses part of it.
#![allow(dead_code)]

use std::sync::OnceLock;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

pub(crate) mod delay_proxy;
pub(crate) mod http;

pub(crate) const INSERT_ORDER: &str =
    "INSERT INTO orders (user_id, amount) VALUES ($1, $2) RETURNING id";
/// The claim's columns of a record, as the crate reads them.
pub(crate) const COLUMNS: &str = "status, headers, body, fingerprint, expires_at <= now(), \
    state, retryable, ceil(extract(epoch FROM locked_until - now()))::int4, \
    extract(epoch FROM expires_at - now())::float8, body_key_id";
pub(crate) const LOOKUP: &str = "SELECT status, headers, body, fingerprint, expires_at <= now(), \
    state, retryable, ceil(extract(epoch FROM locked_until - now()))::int4, \
    extract(epoch FROM expires_at - now())::float8, body_key_id \
    FROM idempotency_records WHERE id = $1";
/// The table's oid in the high half of a record's lock key, as the crate mixes it in.
pub(crate) const LOCK_EXPR: &str = "('idempotency_records'::regclass::oid::int8 << 32)";
pub(crate) const TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock(($1 # \
    ('idempotency_records'::regclass::oid::int8 << 32)))";
pub(crate) const CLAIM: &str = "SELECT * FROM axum_idempotency_claim($1, ($2 # \
    ('idempotency_records'::regclass::oid::int8 << 32)))";
/// Whether the record exists: the look-up under the lock of the shipped claim.
pub(crate) const EXISTS: &str = "SELECT 1 FROM idempotency_records WHERE id = $1";
pub(crate) const INSERT_RECORD: &str = "INSERT INTO idempotency_records \
    (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, expires_at) \
    VALUES ($1, '', NULL, $2, 201, $3, $4, NULL, now() + make_interval(secs => 86400))";
pub(crate) const HEADERS: &[u8] = b"\x00\x0ccontent-type\x00\x00\x00\x10application/json";
pub(crate) const FINGERPRINT: &[u8] = &[7; 32];
pub(crate) const BODY: &[u8] = br#"{"id":1,"user_id":1,"amount":2}"#;

/// A record id, sent as `uuid`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Uuid(pub(crate) [u8; 16]);

impl ToSql for Uuid {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::UUID
    }

    to_sql_checked!();
}

#[cfg(feature = "sqlx")]
impl sqlx::Type<sqlx::Postgres> for Uuid {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_oid(sqlx::postgres::types::Oid(2950))
    }
}

#[cfg(feature = "sqlx")]
impl sqlx::Encode<'_, sqlx::Postgres> for Uuid {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        buf.extend_from_slice(&self.0);
        Ok(sqlx::encode::IsNull::No)
    }
}

impl Uuid {
    /// A fresh id per call, spread over the key space like the SHA-256 ids the crate writes.
    pub(crate) fn fresh() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mix = |mut z: u64| {
            // splitmix64
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut id = [0; 16];
        id[..8].copy_from_slice(&mix(n ^ (u64::from(std::process::id()) << 32)).to_be_bytes());
        id[8..].copy_from_slice(&mix(n.rotate_left(17)).to_be_bytes());
        Self(id)
    }

    /// The key of the record's advisory lock, before the table's oid is mixed in.
    pub(crate) fn lock_key(self) -> i64 {
        i64::from_be_bytes(self.0[..8].try_into().unwrap())
    }

    /// The canonical text form, for statements with the values inlined.
    pub(crate) fn text(self) -> String {
        let h = hex(&self.0);
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The PostgreSQL URL every connection of the benchmark uses: `DATABASE_URL`, or, once
/// [`through_delay_proxy`] ran, the same through the proxy.
pub(crate) fn database_url() -> String {
    PROXIED_URL
        .get()
        .cloned()
        .unwrap_or_else(direct_database_url)
}

/// `DATABASE_URL` as given (default `postgres://postgres@127.0.0.1:5432/postgres`).
pub(crate) fn direct_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

static PROXIED_URL: OnceLock<String> = OnceLock::new();

/// Puts a [`delay_proxy`] delaying each direction by `delay` between the benchmark and
/// PostgreSQL: from now on [`database_url`] names the proxy. The URL's host must be an IP
/// address with its port (`postgres://user@127.0.0.1:5432/db`).
pub(crate) fn through_delay_proxy(delay: std::time::Duration) {
    let url = direct_database_url();
    let (scheme, rest) = url.split_once("://").expect("DATABASE_URL is a URL");
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let upstream: std::net::SocketAddr = host_port.parse().unwrap_or_else(|_| {
        panic!("--network-delay-us needs DATABASE_URL's host as ip:port, not {host_port}")
    });
    let proxy = delay_proxy::start(upstream, delay);
    let rest = rest.replacen(host_port, &proxy.to_string(), 1);
    PROXIED_URL
        .set(format!("{scheme}://{rest}"))
        .expect("one proxy per process");
}

/// A fresh schema at `DATABASE_URL`, the crate migrated into it and an `orders` table: a
/// pool of `pool_size` whose connections search it, and an admin connection.
pub(crate) async fn fresh_schema(schema: &str, pool_size: usize) -> (Pool, tokio_postgres::Client) {
    let url = database_url();
    let (admin, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("connect to DATABASE_URL");
    tokio::spawn(connection);
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await
        .unwrap();
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.options(format!("-c search_path={schema}"));
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager).max_size(pool_size).build().unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, \
             amount bigint NOT NULL)",
        )
        .await
        .unwrap();
    (pool, admin)
}
