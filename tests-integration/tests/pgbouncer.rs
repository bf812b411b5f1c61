//! Behind PgBouncer in transaction pooling mode: every transaction, and every statement
//! outside one, may run on another server connection.
//!
//! Each test starts its own PgBouncer (the `pgbouncer` binary on `PATH`; Debian's package
//! `pgbouncer`, 1.18, which has no prepared-statement support in transaction mode) on an
//! ephemeral port, in front of a database of its own on the server named by `DATABASE_URL`,
//! with fewer server connections than the application's pool holds, so connections really
//! are switched between transactions. Without `pgbouncer` the tests are skipped, unless
//! `CI` is set, when they fail.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use axum_idempotency::inbox::Outcome;
use axum_idempotency::postgres::IdempotentTx;
use axum_idempotency::{
    Admin, Error, IdempotencyLayer, IdempotentLease, Inbox, InboxError, Sweeper,
};
use common::{
    Knobs, connect, database_url, post_json, router, scoped, send, start_orders_example,
    unique_name,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

/// Server connections PgBouncer opens to the database: fewer than the application's pool.
const SERVER_POOL_SIZE: usize = 4;

/// The `pgbouncer` binary, or `None` when the test is to be skipped.
fn pgbouncer_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        // Debian installs it in /usr/sbin, which an unprivileged user's PATH may lack.
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file());
    if on_path.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "pgbouncer is not installed (CI is set, so this is an error): \
             apt-get install pgbouncer"
        );
        eprintln!("SKIPPED: pgbouncer is not installed (apt-get install pgbouncer)");
    }
    on_path
}

/// A free TCP port on loopback (bound, then released for PgBouncer to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `id -u postgres` / `id -g postgres`.
fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run `id`");
        assert!(
            out.status.success(),
            "PgBouncer refuses to run as root, and there is no `postgres` user to run it as"
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (id("-u"), id("-g"))
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// A PgBouncer in transaction pooling mode in front of a fresh database of its own. Dropped,
/// it kills PgBouncer, drops the database and removes its directory.
struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
    database: String,
    user: String,
}

impl Bouncer {
    async fn start(binary: &Path) -> Self {
        let server: tokio_postgres::Config = database_url().parse().unwrap();
        let user = server.get_user().unwrap_or("postgres").to_owned();
        let host = match server.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            Some(Host::Unix(dir)) => dir.display().to_string(),
            None => "127.0.0.1".to_owned(),
        };
        let server_port = server.get_ports().first().copied().unwrap_or(5432);
        let password = server
            .get_password()
            .map(|p| format!(" password={}", String::from_utf8_lossy(p)))
            .unwrap_or_default();

        // A database of its own: PgBouncer refuses the `options` startup parameter the other
        // tests use for a private search_path.
        let database = unique_name("pgb");
        connect(&database_url())
            .await
            .batch_execute(&format!("CREATE DATABASE {database}"))
            .await
            .unwrap();

        let dir = std::env::temp_dir().join(&database);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        std::fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        let ini = format!(
            "[databases]\n\
             {database} = host={host} port={server_port} dbname={database} user={user}{password}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir = {dir}\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             admin_users = {user}\n\
             pool_mode = transaction\n\
             default_pool_size = {SERVER_POOL_SIZE}\n\
             max_client_conn = 500\n\
             logfile = {dir}/pgbouncer.log\n",
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();

        let mut command = Command::new(binary);
        command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if running_as_root() {
            // PgBouncer refuses to run as root. Switching user in the child itself (rather
            // than through `runuser`, which forks) keeps PgBouncer the process we kill.
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
            command.uid(uid).gid(gid);
        }
        let child = command.spawn().expect("start pgbouncer");
        let mut bouncer = Self {
            child,
            dir,
            port,
            database,
            user,
        };
        bouncer.wait_until_ready().await;
        bouncer
    }

    async fn wait_until_ready(&mut self) {
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("pgbouncer exited with {status}:\n{}", self.log());
            }
            if let Ok((client, connection)) = tokio_postgres::connect(&self.url(), NoTls).await {
                tokio::spawn(connection);
                if client.simple_query("SELECT 1").await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "pgbouncer did not accept connections in 10 s:\n{}",
            self.log()
        );
    }

    fn url(&self) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{}",
            self.user, self.port, self.database
        )
    }

    /// A direct connection to the test's database, bypassing PgBouncer, for checks.
    async fn direct(&self) -> tokio_postgres::Client {
        let mut config: tokio_postgres::Config = database_url().parse().unwrap();
        config.dbname(&self.database);
        let (client, connection) = config.connect(NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// A pool of `size` connections through PgBouncer.
    fn pool(&self, size: usize) -> Pool {
        let manager = Manager::from_config(
            self.url().parse().unwrap(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(size)
            .wait_timeout(Some(Duration::from_secs(10)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap()
    }

    /// Server connections PgBouncer holds to the test's database right now, counted over
    /// `direct` (which is not one of them).
    async fn server_connections(&self, direct: &tokio_postgres::Client) -> i64 {
        direct
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        let database = self.database.clone();
        // Dropping runs inside the test's runtime; use a thread with its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let admin = connect(&database_url()).await;
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
                    .await;
            });
        })
        .join();
    }
}

/// The tables `common::router`'s handler writes, created through PgBouncer.
async fn create_tables(pool: &Pool) {
    axum_idempotency::migrate(pool).await.unwrap();
    pool.get()
        .await
        .unwrap()
        .batch_execute(common::TEST_TABLES)
        .await
        .unwrap();
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

// ---------------------------------------------------------------------------------------
// The orders example as a child process, its DATABASE_URL pointing at PgBouncer.

/// One HTTP/1.1 exchange over a fresh connection.
struct HttpAnswer {
    status: u16,
    replayed: bool,
    body: String,
}

async fn post_order(addr: SocketAddr, key: &str, amount: i64) -> HttpAnswer {
    let body = format!(r#"{{"user_id": 1001, "amount": {amount}}}"#);
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\n\
         x-user-id: 1001\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    HttpAnswer {
        status: head[9..12].parse().unwrap(),
        replayed: head
            .lines()
            .any(|line| line.eq_ignore_ascii_case("idempotent-replayed: true")),
        body: body.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_example_behind_pgbouncer_replays_and_runs_once_under_concurrency() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(binary) = pgbouncer_binary() else {
        return;
    };
    let bouncer = Bouncer::start(&binary).await;
    let (_example, addr) = start_orders_example(&[
        ("DATABASE_URL", bouncer.url().as_str()),
        ("PREPARED_STATEMENTS", "false"),
    ])
    .await;
    let addr: SocketAddr = addr.parse().unwrap();
    let direct = bouncer.direct().await;

    // Replay: the same key twice gives the same body, the second marked as a replay.
    let first = post_order(addr, "pgb-1", 299).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert!(!first.replayed);
    let again = post_order(addr, "pgb-1", 299).await;
    assert_eq!(
        (again.status, again.body.as_str()),
        (201, first.body.as_str())
    );
    assert!(again.replayed);

    // Fresh keys in parallel, more than PgBouncer has server connections: every one runs.
    let fresh: Vec<_> = (0..24)
        .map(|i| tokio::spawn(async move { post_order(addr, &format!("pgb-f{i}"), 5).await }))
        .collect();
    for answer in fresh {
        let answer = answer.await.unwrap();
        assert_eq!(answer.status, 201, "{}", answer.body);
    }

    // Concurrency: 32 requests with one key, over real HTTP. Exactly one runs; the others
    // find it in flight (409) or replay its answer.
    let racers: Vec<_> = (0..32)
        .map(|_| tokio::spawn(post_order(addr, "pgb-race", 7)))
        .collect();
    let mut executed = Vec::new();
    for answer in racers {
        let answer = answer.await.unwrap();
        match (answer.status, answer.replayed) {
            (201, false) => executed.push(answer.body),
            (201, true) | (409, false) => {}
            other => panic!("unexpected answer {other:?}: {}", answer.body),
        }
    }
    assert_eq!(executed.len(), 1, "exactly one request ran: {executed:?}");
    let replay = post_order(addr, "pgb-race", 7).await;
    assert!(replay.replayed);
    assert_eq!(replay.body, executed[0]);

    assert_eq!(
        count(&direct, "SELECT count(*) FROM orders WHERE amount = 7").await,
        1
    );
    assert_eq!(count(&direct, "SELECT count(*) FROM orders").await, 26);
    assert_eq!(
        count(&direct, "SELECT count(*) FROM idempotency_records").await,
        26
    );
    let servers = bouncer.server_connections(&direct).await;
    assert!(
        (1..=SERVER_POOL_SIZE as i64).contains(&servers),
        "{servers} server connections"
    );
}

// ---------------------------------------------------------------------------------------
// The layer, the inbox, the sweeper and the admin view in-process, through PgBouncer.

async fn charge(lease: IdempotentLease) -> (StatusCode, Json<serde_json::Value>) {
    let token = lease.fencing_token();
    (
        StatusCode::CREATED,
        Json(json!({ "charged": true, "token": token })),
    )
}

fn app(pool: &Pool, prepared_statements: bool) -> Router {
    let layer =
        scoped(IdempotencyLayer::new(pool.clone())).prepared_statements(prepared_statements);
    let lease_routes = Router::new()
        .route("/charges", post(charge))
        .layer(layer.clone());
    router(Arc::new(Knobs::default()), layer).merge(lease_routes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layer_inbox_and_sweeper_work_behind_pgbouncer_without_prepared_statements() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(binary) = pgbouncer_binary() else {
        return;
    };
    let bouncer = Bouncer::start(&binary).await;
    // Four times as many client connections as PgBouncer has server connections.
    let pool = bouncer.pool(4 * SERVER_POOL_SIZE);
    create_tables(&pool).await;
    let direct = bouncer.direct().await;
    let app = app(&pool, false);

    // Atomic mode: first request, then its replay.
    let body = json!({"amount": 299});
    let first = send(&app, post_json("/orders", Some("a-1"), &body)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(!first.replayed());
    let replay = send(&app, post_json("/orders", Some("a-1"), &body)).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);

    // 64 concurrent requests with one key: one order, the others 409 or a replay.
    let racers: Vec<_> = (0..64)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                send(
                    &app,
                    post_json("/orders", Some("a-race"), &json!({"amount": 64})),
                )
                .await
            })
        })
        .collect();
    let mut ran = 0;
    for answer in racers {
        let answer = answer.await.unwrap();
        match (answer.status, answer.replayed()) {
            (StatusCode::CREATED, false) => ran += 1,
            (StatusCode::CREATED, true) => {}
            (StatusCode::CONFLICT, _) => assert_eq!(answer.problem_code(), "in_flight"),
            other => panic!("unexpected answer {other:?}: {:?}", answer.body),
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(
        count(&direct, "SELECT count(*) FROM orders WHERE amount = 64").await,
        1
    );
    // Many client connections were served by a few server connections.
    let clients = pool.status().size;
    let servers = bouncer.server_connections(&direct).await;
    assert!(
        clients > SERVER_POOL_SIZE && servers <= SERVER_POOL_SIZE as i64,
        "{clients} client connections, {servers} server connections"
    );

    // Lease mode: claim committed on its own, completion fenced, then a replay.
    let charge = || post_json("/charges", Some("l-1"), &json!({"amount": 5}));
    let first = send(&app, charge()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert_eq!(first.json()["token"], 1);
    let replay = send(&app, charge()).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);

    // The inbox: processed once, then a duplicate; a failure is recorded.
    let inbox = Inbox::new(pool.clone(), "coupons").prepared_statements(false);
    let grant = |tx: IdempotentTx| async move {
        tx.execute("INSERT INTO orders (user_id, amount) VALUES (7, 50)", &[])
            .await
            .map(drop)
    };
    let outcome = inbox.process("msg-1", grant).await.unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    let outcome = inbox.process("msg-1", grant).await.unwrap();
    assert_eq!(outcome, Outcome::Duplicate { attempts: 1 });
    let failed = inbox
        .process("msg-2", |_tx| async { Err::<(), _>("downstream is down") })
        .await;
    assert!(
        matches!(failed, Err(InboxError::Failed { attempts: 1, .. })),
        "{failed:?}"
    );
    assert_eq!(
        count(&direct, "SELECT count(*) FROM orders WHERE user_id = 7").await,
        1
    );

    // The admin view.
    let admin = Admin::new(pool.clone()).prepared_statements(false);
    let record = admin.lookup("", "a-1").await.unwrap().unwrap();
    assert_eq!((record.state.as_str(), record.status), ("SUCCESS", 201));
    assert!(admin.stale(10).await.unwrap().is_empty());
    let message = admin.inbox_message("coupons", "msg-1").await.unwrap();
    assert_eq!(message.unwrap().status, "SUCCESS");
    assert_eq!(admin.failed_messages("coupons", 10).await.unwrap().len(), 1);

    // The sweeper: one expired record purged, one abandoned lease reported and marked.
    direct
        .batch_execute(
            "UPDATE idempotency_records SET expires_at = now() - interval '1 hour' \
             WHERE id = (SELECT id FROM idempotency_records ORDER BY created_at LIMIT 1);
             UPDATE idempotency_records \
             SET state = 'PROCESSING', locked_until = now() - interval '1 hour' \
             WHERE fencing_token = 1",
        )
        .await
        .unwrap();
    let report = Sweeper::new(pool.clone())
        .prepared_statements(false)
        .mark_stale_failed_after(Duration::from_secs(60))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.purged_records, 1, "{report:?}");
    assert_eq!(report.stale_processing, 1, "{report:?}");
    assert_eq!(report.marked_failed, 1, "{report:?}");
    let report = admin.purge_now().await.unwrap();
    assert_eq!(report.purged_records, 0, "{report:?}");
}

/// Why the setting exists: with prepared statements on, PgBouncer 1.18 in transaction mode
/// runs a statement on a server connection that never prepared it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prepared_statements_fail_behind_pgbouncer_in_transaction_mode() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(binary) = pgbouncer_binary() else {
        return;
    };
    let bouncer = Bouncer::start(&binary).await;
    let pool = bouncer.pool(4 * SERVER_POOL_SIZE);
    create_tables(&pool).await;
    let app = app(&pool, true);

    let requests: Vec<_> = (0..64)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let key = format!("p-{i}");
                send(
                    &app,
                    post_json("/orders", Some(&key), &json!({"amount": 1})),
                )
                .await
            })
        })
        .collect();
    let mut unavailable = 0;
    for answer in requests {
        let answer = answer.await.unwrap();
        match answer.status {
            StatusCode::CREATED => {}
            StatusCode::SERVICE_UNAVAILABLE => {
                unavailable += 1;
                let code = answer.problem_code();
                assert!(
                    ["store_unavailable", "commit_failed"].contains(&code.as_str()),
                    "{code}"
                );
            }
            other => panic!("unexpected answer {other}: {:?}", answer.body),
        }
    }
    eprintln!("prepared statements through PgBouncer: {unavailable} of 64 requests got 503");
    assert!(
        unavailable > 0,
        "expected prepared statements to break behind PgBouncer 1.18 in transaction mode"
    );
    // The inbox fails the same way.
    let inbox = Inbox::new(pool.clone(), "coupons");
    let outcomes: Vec<_> = (0..32)
        .map(|i| {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                inbox
                    .process(&format!("m-{i}"), |_tx| async { Ok::<_, Error>(()) })
                    .await
            })
        })
        .collect();
    let mut store_errors = 0;
    for outcome in outcomes {
        if let Err(InboxError::Store(_)) = outcome.await.unwrap() {
            store_errors += 1;
        }
    }
    eprintln!("prepared statements through PgBouncer: {store_errors} of 32 messages failed");
    assert!(
        store_errors > 0,
        "expected the inbox's prepared statements to break"
    );
}

/// The outbox behind PgBouncer: no LISTEN (transaction pooling loses it), no prepared
/// statements (PgBouncer 1.18). Producers enqueue through PgBouncer, a polling relay
/// publishes every message once, in order per key, and marks each SENT.
#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_outbox_relay_polls_behind_pgbouncer_without_prepared_statements() {
    if !common::Database::Postgres.configured() {
        return;
    }
    use axum_idempotency::outbox::{OutboxMessage, OutboxRelay, RabbitPublisher};
    use futures_util::StreamExt;

    let Some(binary) = pgbouncer_binary() else {
        return;
    };
    let amqp_url = common::amqp_url();
    let broker =
        match lapin::Connection::connect(&amqp_url, lapin::ConnectionProperties::default()).await {
            Ok(broker) => broker,
            Err(e) if std::env::var_os("CI").is_none() => {
                eprintln!("SKIPPED: no RabbitMQ at {amqp_url} ({e})");
                return;
            }
            Err(e) => panic!("connect to RabbitMQ at AMQP_URL: {e}"),
        };
    let bouncer = Bouncer::start(&binary).await;
    let pool = bouncer.pool(4 * SERVER_POOL_SIZE);
    create_tables(&pool).await;
    let direct = bouncer.direct().await;
    let queue = unique_name("outbox_bouncer");
    let channel = broker.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();

    let relay = OutboxRelay::new(pool.clone(), RabbitPublisher::new(amqp_url))
        .prepared_statements(false)
        .batch_size(10)
        .poll_interval(Duration::from_millis(50))
        .spawn();
    let producers: Vec<_> = (0..8)
        .map(|producer| {
            let (pool, queue) = (pool.clone(), queue.clone());
            tokio::spawn(async move {
                for i in 0..10 {
                    let mut client = pool.get().await.unwrap();
                    let tx = client.transaction().await.unwrap();
                    let message = OutboxMessage::new(queue.as_str(), format!("{producer}-{i}"))
                        .id(format!("m-{producer}-{i}"))
                        .ordering_key(format!("producer-{producer}"));
                    axum_idempotency::postgres::enqueue(&*tx, &message)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }

    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "bouncer-test".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut last_of_producer = std::collections::HashMap::new();
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 80 {
        let delivery = tokio::time::timeout(Duration::from_secs(20), consumer.next())
            .await
            .expect("the polling relay delivers")
            .unwrap()
            .unwrap();
        let body = String::from_utf8(delivery.data).unwrap();
        let (producer, i) = body.split_once('-').unwrap();
        let i: i32 = i.parse().unwrap();
        let last = last_of_producer.insert(producer.to_owned(), i);
        assert!(last.is_none_or(|last| last < i), "{body} after {last:?}");
        assert!(seen.insert(body.clone()), "{body} twice");
    }
    relay.shutdown().await;
    assert_eq!(
        count(
            &direct,
            "SELECT count(*) FROM idempotency_outbox WHERE state = 'SENT'"
        )
        .await,
        80
    );
    channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}
