//! The orders example on the databases that are not PostgreSQL, as a user runs it: the
//! README's run command with no `DATABASE_URL` and no server (a SQLite file in the working
//! directory), a `sqlite:` file, MariaDB; and what it says when it cannot start.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::raw_http::*;
use common::*;

/// The example as a child process in `dir`, with `env` and without `DATABASE_URL` unless
/// `env` sets it; its address once it serves.
async fn start_in(dir: &Path, env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::new(example_binary("orders"));
    command
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("ADMIN_PASSWORD")
        .env_remove("ARCHIVE_JSONL")
        .env("BIND_ADDR", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some((_, addr)) = line.split_once("listening on http://") {
                return addr.trim().to_owned();
            }
        }
        panic!("the example exited before serving");
    })
    .await
    .expect("the example did not start in 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// Stops the example with SIGTERM; it exits cleanly.
async fn stop(mut child: tokio::process::Child) {
    let pid = child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// The example started with `env` in `dir` that must not serve: its exit status and what
/// it wrote to stderr.
async fn fails_to_start(dir: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let mut command = tokio::process::Command::new(example_binary("orders"));
    command
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env("BIND_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("the example neither served nor exited in 30 s")
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The request/answer contract every database serves the same way: created, replayed
/// byte for byte, 422 for another body under the key, 422 for a non-positive amount,
/// read back, paid once. Returns the first order's number and answer.
async fn serves_the_contract(addr: &str, key: &str) -> (String, String) {
    let (status, first) = http(addr, &post_order(key, 299)).await;
    assert_eq!(status, 201, "{first}");
    let order: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(order["amount"], 299);
    assert_eq!(order["user_id"], 1001);
    let order_no = order["order_no"].as_str().unwrap().to_owned();
    assert!(order_no.starts_with("ORD-"), "{order_no}");
    assert_eq!(
        http(addr, &post_order(key, 299)).await,
        (201, first.clone())
    );
    assert_eq!(http(addr, &post_order(key, 300)).await.0, 422);
    assert_eq!(
        http(addr, &post_order(&format!("{key}-zero"), 0)).await.0,
        422
    );
    let (status, fetched) = http(
        addr,
        &format!("GET /orders/{order_no} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!((status, fetched.as_str()), (200, first.as_str()));
    let paid_key = format!("{key}-pay");
    let (status, paid) = http(addr, &pay(&order_no, Some(&paid_key))).await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&paid).unwrap(),
        serde_json::json!({"order_no": order_no, "status": "PAID"})
    );
    assert_eq!(
        http(addr, &pay(&order_no, Some(&paid_key))).await,
        (200, paid.clone())
    );
    assert_eq!(
        http(addr, &pay(&order_no, Some(&format!("{key}-pay-2")))).await,
        (200, paid)
    );
    assert_eq!(
        http(addr, &pay("ORD-999999", Some(&format!("{key}-pay-3"))))
            .await
            .0,
        404
    );
    assert_eq!(http(addr, &pay(&order_no, None)).await.0, 400);
    refusals_leave_the_key_free(addr, &format!("{key}-refused")).await;
    (order_no, first)
}

/// What is refused before any work is not stored: a caller without an integer
/// `X-User-Id` (400), a body without `Content-Type` (415) and a non-positive amount (422)
/// each leave the key free, and the corrected request under it creates the order.
async fn refusals_leave_the_key_free(addr: &str, key: &str) {
    let body = r#"{"user_id": 1001, "amount": 5}"#;
    let request = |headers: &str| {
        format!(
            "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\n\
             {headers}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    for (headers, status, code) in [
        (
            "content-type: application/json\r\n",
            400,
            "invalid_x_user_id",
        ),
        (
            "x-user-id: abc\r\ncontent-type: application/json\r\n",
            400,
            "invalid_x_user_id",
        ),
        ("x-user-id: 1001\r\n", 415, "unsupported_media_type"),
    ] {
        let (got, answer) = http(addr, &request(headers)).await;
        assert_eq!(got, status, "{headers:?}: {answer}");
        let problem: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], code, "{headers:?}");
    }
    assert_eq!(http(addr, &post_order(key, -1)).await.0, 422);
    // Had any refusal been stored, this would replay it or answer 422 `key_reused`.
    let (status, created) = http(addr, &post_order(key, 5)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(http(addr, &post_order(key, 5)).await, (201, created));
}

/// A raw keyed `POST /orders` whose answer headers are kept.
async fn replayed_header(addr: &str, key: &str) -> (u16, String, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(post_order(key, 299).as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (
        response[9..12].parse().unwrap(),
        body.to_owned(),
        head.to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
    )
}

/// A directory of the test's own, removed when it ends.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir()
            .join("axum-idempotency-tests")
            .join(unique_name("example"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The README's run command: no `DATABASE_URL`, no database server. The example creates
/// `orders.db` in its working directory, serves the whole contract on it with the same
/// `orders` columns as on PostgreSQL, and a key replays after a restart.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_database_url_the_example_serves_on_orders_db_in_its_directory() {
    let dir = TempDir::new();
    let (child, addr) = start_in(&dir.0, &[]).await;
    let file = dir.0.join("orders.db");
    assert!(file.exists(), "orders.db in the working directory");
    let (order_no, first) = serves_the_contract(&addr, "sqlite-1").await;
    stop(child).await;

    let db =
        sqlx::SqlitePool::connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(&file))
            .await
            .unwrap();
    let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info('orders')")
        .fetch_all(&db)
        .await
        .unwrap();
    assert_eq!(
        columns,
        ["order_no", "user_id", "amount", "created_at", "status"]
    );
    let (status, outbox): (String, i64) = sqlx::query_as(
        "SELECT (SELECT status FROM orders WHERE order_no = ?), \
         (SELECT count(*) FROM idempotency_outbox WHERE topic = 'payment-succeeded')",
    )
    .bind(&order_no)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), outbox),
        ("PAID", 1),
        "paid once, one message"
    );
    db.close().await;

    // After a restart the same key is answered from the file.
    let (child, addr) = start_in(&dir.0, &[]).await;
    let (status, body, replayed) = replayed_header(&addr, "sqlite-1").await;
    assert_eq!(
        (status, body.as_str(), replayed),
        (201, first.as_str(), true)
    );
    stop(child).await;
}

/// `RECORD_TTL_SECS=2 SWEEP_INTERVAL_SECS=1`: a key's record is archived and purged once its
/// TTL has passed, and the key then runs again as a new request; its archived row stays.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_ttl_and_sweep_interval_archive_and_free_a_key() {
    let dir = TempDir::new();
    let env = [("RECORD_TTL_SECS", "2"), ("SWEEP_INTERVAL_SECS", "1")];
    let (child, addr) = start_in(&dir.0, &env).await;
    let (status, first, _) = replayed_header(&addr, "ttl-1").await;
    assert_eq!(status, 201, "{first}");
    let (_, _, replayed) = replayed_header(&addr, "ttl-1").await;
    assert!(replayed, "within its TTL the key replays");
    let db = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new().filename(dir.0.join("orders.db")),
    )
    .await
    .unwrap();
    let mut records = -1;
    for _ in 0..100 {
        records = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
            .fetch_one(&db)
            .await
            .unwrap();
        if records == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(records, 0, "the sweeper purged the record within 10 s");
    let archived = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records_archive")
            .fetch_one(&db)
            .await
            .unwrap()
    };
    assert_eq!(
        archived().await,
        1,
        "the purged record is in the archive, once"
    );
    let (status, again, replayed) = replayed_header(&addr, "ttl-1").await;
    assert_eq!(status, 201, "{again}");
    assert!(!replayed, "after its TTL the key runs as new");
    assert_ne!(again, first, "a new order");
    for _ in 0..100 {
        if archived().await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        archived().await,
        2,
        "the second record archived beside the first"
    );
    let bodies: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT body FROM idempotency_records_archive ORDER BY created_at")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(bodies, [first.into_bytes(), again.into_bytes()]);
    stop(child).await;
}

/// `ARCHIVE_JSONL`: the sweeper archives into a file of JSON lines (the example's
/// `ArchiveSink`) instead of the table; each purged record is one line, its answer kept. A
/// record the file already holds (written, then the service crashed before the delete) is
/// purged without a second line.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_jsonl_writes_each_purged_record_to_the_file_once() {
    let dir = TempDir::new();
    let file = dir.0.join("archive.jsonl");
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    };
    let count = async |db: &sqlx::SqlitePool, table: &str| -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(db)
            .await
            .unwrap()
    };

    // A record written to the file by a sweep that crashed before its delete.
    let (child, addr) = start_in(&dir.0, &[("RECORD_TTL_SECS", "1")]).await;
    let (status, first, _) = replayed_header(&addr, "jsonl-1").await;
    assert_eq!(status, 201, "{first}");
    stop(child).await;
    let db = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new().filename(dir.0.join("orders.db")),
    )
    .await
    .unwrap();
    let (id, created_us): (String, i64) = sqlx::query_as(
        "SELECT lower(hex(id)), CAST(round(created_at * 1e6) AS INTEGER) FROM idempotency_records",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    let written = serde_json::json!({ "archive_id": format!("{id}-{created_us}"), "body": first });
    std::fs::write(&file, format!("{written}\n")).unwrap();

    let env = [
        ("RECORD_TTL_SECS", "1"),
        ("SWEEP_INTERVAL_SECS", "1"),
        ("ARCHIVE_JSONL", "archive.jsonl"),
    ];
    let (child, addr) = start_in(&dir.0, &env).await;
    for _ in 0..100 {
        if count(&db, "idempotency_records").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        count(&db, "idempotency_records").await,
        0,
        "purged within 10 s"
    );
    assert_eq!(
        lines(),
        [written],
        "the record the file held is not written again"
    );

    let (status, again, replayed) = replayed_header(&addr, "jsonl-1").await;
    assert_eq!((status, replayed), (201, false), "{again}");
    for _ in 0..100 {
        if lines().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let archived = lines();
    assert_eq!(archived.len(), 2, "{archived:?}");
    let line = &archived[1];
    assert_eq!(line["scope"], "1001");
    assert_eq!(
        (line["state"].as_str(), line["status"].as_u64()),
        (Some("SUCCESS"), Some(201))
    );
    assert_eq!(
        line["response"]["body"],
        again.as_str(),
        "the answer is kept"
    );
    let id = line["id"].as_str().unwrap();
    assert!(
        line["archive_id"].as_str().unwrap().starts_with(id),
        "{line}"
    );
    assert_ne!(archived[0]["archive_id"], line["archive_id"]);
    assert_eq!(
        count(&db, "idempotency_records_archive").await,
        0,
        "not into the table"
    );
    stop(child).await;
}

/// The console finds a key whose record was archived: its key page lists the archived
/// record, with the size of the response kept.
#[cfg(all(feature = "sqlite", feature = "console"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_an_archived_key() {
    let dir = TempDir::new();
    let env = [
        ("RECORD_TTL_SECS", "1"),
        ("SWEEP_INTERVAL_SECS", "1"),
        ("ADMIN_PASSWORD", "secret"),
    ];
    let (child, addr) = start_in(&dir.0, &env).await;
    assert_eq!(http(&addr, &post_order("archived-1", 7)).await.0, 201);
    let page = || {
        http(
            &addr,
            "GET /admin/key?scope=1001&key=archived-1 HTTP/1.1\r\nhost: x\r\n\
             connection: close\r\nauthorization: Basic YWRtaW46c2VjcmV0\r\n\r\n",
        )
    };
    let mut last = String::new();
    for _ in 0..100 {
        let (status, body) = page().await;
        assert_eq!(status, 200, "{body}");
        last = body;
        // The page reads the record, then its archive: a sweep that commits between the
        // two shows both once, so wait for the record to be gone too.
        if last.contains("id=\"archived\"") && last.contains("No record for key") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last.contains("No record for key"), "{last}");
    assert!(
        last.contains("id=\"archived\""),
        "the archived record listed: {last}"
    );
    assert!(last.contains("bytes kept"), "{last}");
    assert!(last.contains("id=\"show-archived-bodies\""), "{last}");
    let (status, shown) = http(
        &addr,
        "GET /admin/key?scope=1001&key=archived-1&body=1 HTTP/1.1\r\nhost: x\r\n\
         connection: close\r\nauthorization: Basic YWRtaW46c2VjcmV0\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{shown}");
    assert!(
        shown.contains("<pre class=\"archived-body\">{&quot;order_no&quot;:"),
        "the archived answer shown: {shown}"
    );
    let (status, overview) = http(
        &addr,
        "GET /admin/ HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         authorization: Basic YWRtaW46c2VjcmV0\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{overview}");
    assert!(
        overview.contains("<td id=\"archived-count\">1</td>"),
        "the overview counts the archive: {overview}"
    );
    stop(child).await;
}

/// `DATABASE_URL=sqlite:PATH` names the file.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_url_names_the_file() {
    let dir = TempDir::new();
    let file = dir.0.join("elsewhere.db");
    let url = format!("sqlite:{}", file.display());
    let (child, addr) = start_in(&std::env::temp_dir(), &[("DATABASE_URL", &url)]).await;
    assert!(file.exists());
    assert_eq!(http(&addr, &post_order("file-1", 5)).await.0, 201);
    stop(child).await;
}

/// A SQLite file that cannot be written, or in a directory that does not exist: the
/// example exits at start-up with one line naming the path, not at the first request.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn an_unusable_sqlite_path_is_one_line_at_start_up() {
    let dir = TempDir::new();
    let missing = dir.0.join("no-such-dir").join("orders.db");
    let read_only = dir.0.join("read-only.db");
    std::fs::write(&read_only, b"").unwrap();
    for url in [
        format!("sqlite:{}", missing.display()),
        format!("sqlite:{}?mode=ro", read_only.display()),
    ] {
        let (ok, stderr) = fails_to_start(&dir.0, &[("DATABASE_URL", &url)]).await;
        assert!(!ok, "{url}: exits non-zero");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{url}: one line: {stderr}");
        let path = url.trim_start_matches("sqlite:").split('?').next().unwrap();
        assert!(lines[0].contains(path), "{url}: names the path: {stderr}");
    }
}

/// The example on MariaDB: the same contract, and a key replays after a restart.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_serves_on_mariadb() {
    if !Database::MySql.configured() {
        return;
    }
    let db = common::mysql::MySqlDb::bare(2).await;
    let url = format!("{}/{}", common::mysql::mysql_url(), db.name);
    let dir = TempDir::new();
    let (child, addr) = start_in(&dir.0, &[("DATABASE_URL", &url)]).await;
    let (order_no, first) = serves_the_contract(&addr, "mysql-1").await;
    stop(child).await;
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE order_no = ?")
        .bind(&order_no)
        .fetch_one(&db.admin)
        .await
        .unwrap();
    assert_eq!(status, "PAID");
    assert_eq!(
        db.scalar("SELECT count(*) FROM idempotency_outbox").await,
        1
    );
    let (child, addr) = start_in(&dir.0, &[("DATABASE_URL", &url)]).await;
    let (status, body, replayed) = replayed_header(&addr, "mysql-1").await;
    assert_eq!(
        (status, body.as_str(), replayed),
        (201, first.as_str(), true)
    );
    stop(child).await;
}

/// MariaDB down at start-up (nothing listens on the port): one line naming the host and
/// port, exit non-zero.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn mariadb_down_at_start_up_is_one_line_naming_the_host() {
    let dir = TempDir::new();
    let (ok, stderr) = fails_to_start(
        &dir.0,
        &[("DATABASE_URL", "mysql://root@127.0.0.1:1/orders")],
    )
    .await;
    assert!(!ok);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains("127.0.0.1:1"),
        "names host and port: {stderr}"
    );
}

/// Two processes on one SQLite file: 32 concurrent requests with one key, half to each,
/// create one order, and every 201 is the same answer.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_on_one_sqlite_file_run_a_key_once() {
    let dir = TempDir::new();
    let (first, first_addr) = start_in(&dir.0, &[]).await;
    let (second, second_addr) = start_in(&dir.0, &[]).await;
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let addr = if i % 2 == 0 {
                first_addr.clone()
            } else {
                second_addr.clone()
            };
            tokio::spawn(async move { http(&addr, &post_order("two-processes", 7)).await })
        })
        .collect();
    let mut created = Vec::new();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        match status {
            201 => created.push(body),
            409 => {}
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|body| *body == created[0]),
        "{created:?}"
    );
    stop(first).await;
    stop(second).await;
    let db = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new().filename(dir.0.join("orders.db")),
    )
    .await
    .unwrap();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(orders, 1, "one order for one key across two processes");
}

/// What `cargo run` prints is enough for a first request: the address, the SQLite file's
/// full path, and a `curl` that, pasted into a shell, creates an order (201) and, pasted
/// again, is answered with the same order, replayed.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_curl_creates_an_order_then_replays_it() {
    use tokio::io::AsyncBufReadExt;
    if std::process::Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "curl is not installed (CI is set, so this is an error)"
        );
        eprintln!("skipped: curl is not installed");
        return;
    }
    let dir = TempDir::new();
    let mut child = tokio::process::Command::new(example_binary("orders"))
        .current_dir(&dir.0)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("ADMIN_PASSWORD")
        .env("BIND_ADDR", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let done = line.trim_start().starts_with("curl ");
            printed.push(line);
            if done {
                return;
            }
        }
        panic!("the example exited before printing a curl: {printed:?}");
    })
    .await
    .expect("the example did not print a curl in 30 s");
    let addr = printed
        .iter()
        .find_map(|line| line.split_once("listening on http://"))
        .map(|(_, addr)| addr.trim().to_owned())
        .expect("the address is printed");
    let file = std::fs::canonicalize(dir.0.join("orders.db")).unwrap();
    assert!(
        printed
            .iter()
            .any(|line| line == &format!("database: SQLite file {}", file.display())),
        "the database's full path is printed: {printed:?}"
    );
    let curl = printed.last().unwrap().trim().to_owned();
    assert!(curl.contains(&format!("http://{addr}/orders")), "{curl}");

    // Pasted twice: `-s` keeps curl's progress meter out of what the shell prints.
    let paste = move || {
        let output = std::process::Command::new("sh")
            .args(["-c", &curl.replacen("curl ", "curl -s ", 1)])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout)
            .unwrap()
            .replace("\r\n", "\n")
    };
    let first = tokio::task::spawn_blocking(paste.clone()).await.unwrap();
    let again = tokio::task::spawn_blocking(paste).await.unwrap();
    assert!(first.starts_with("HTTP/1.1 201 Created\n"), "{first}");
    assert!(!first.contains("idempotent-replayed"), "{first}");
    assert!(again.starts_with("HTTP/1.1 201 Created\n"), "{again}");
    assert!(again.contains("idempotent-replayed: true\n"), "{again}");
    let body = |answer: &str| answer.rsplit("\n\n").next().unwrap().to_owned();
    assert_eq!(body(&first), body(&again));
    assert!(
        body(&first).contains(r#""user_id":1001,"amount":299"#),
        "{first}"
    );
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    stop(child).await;
}
