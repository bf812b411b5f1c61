//! A TCP proxy between a test's pool and PostgreSQL that can cut the link: every
//! connection at once, or the first connection whose client→server stream carries a given
//! byte pattern (such as the simple-query `COMMIT` message), with or without forwarding it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;

use super::database_url;

/// The simple-query message `COMMIT`: 'Q', its length (4 + 7), "COMMIT\0".
pub const COMMIT_QUERY: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

/// What to do when the armed pattern shows up on a connection.
struct Rule {
    pattern: Vec<u8>,
    /// Forward the message (and everything before it) to the server, relay nothing more
    /// back, then cut; otherwise cut before the message reaches the server.
    forward: bool,
}

struct Shared {
    upstream: SocketAddr,
    /// Bumped to cut every live connection.
    cut_all: watch::Sender<u64>,
    rule: std::sync::Mutex<Option<Rule>>,
    /// A permit per fired rule.
    fired: Semaphore,
    accepted: AtomicUsize,
}

/// A proxy on `127.0.0.1:0`, forwarding to the PostgreSQL of `DATABASE_URL`.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start() -> Self {
        let url: tokio_postgres::Config = database_url().parse().unwrap();
        let port = url.get_ports().first().copied().unwrap_or(5432);
        let host = match url.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let upstream = tokio::net::lookup_host((host.as_str(), port))
            .await
            .unwrap()
            .next()
            .unwrap();
        Self::to(upstream).await
    }

    /// A proxy on `127.0.0.1:0` forwarding to any TCP service at `upstream` (an HTTP
    /// server too: a rule matching a request then cuts the connection after the server
    /// read it, before its answer gets back).
    pub async fn to(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            cut_all: watch::channel(0).0,
            rule: std::sync::Mutex::new(None),
            fired: Semaphore::new(0),
            accepted: AtomicUsize::new(0),
        });
        let accept = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(relay(Arc::clone(&shared), client));
                }
            }
        });
        Self {
            addr,
            shared,
            accept,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Cuts every live connection now; new connections are still accepted.
    pub fn cut_all(&self) {
        self.shared
            .cut_all
            .send_modify(|generation| *generation += 1);
    }

    /// Arms a one-shot cut: the first connection whose client→server stream contains
    /// `pattern` is cut there. With `forward`, the bytes up to and including the pattern
    /// reach the server, nothing the server answers afterwards is relayed, and the link is
    /// cut shortly after (the server has read the message); without, the bytes from the
    /// pattern on never reach the server.
    pub fn cut_on(&self, pattern: &[u8], forward: bool) {
        *self.shared.rule.lock().unwrap() = Some(Rule {
            pattern: pattern.to_vec(),
            forward,
        });
    }

    /// Waits (bounded) until the armed rule has fired.
    pub async fn wait_fired(&self, timeout: Duration) {
        tokio::time::timeout(timeout, self.shared.fired.acquire())
            .await
            .expect("the proxy's cut rule did not fire in time")
            .unwrap()
            .forget();
    }

    /// A pool of `max_size` connections through this proxy, in `schema`, named `schema`
    /// in `pg_stat_activity`; fails fast when the link is down.
    pub fn pool(&self, schema: &str, max_size: usize) -> Pool {
        let url: tokio_postgres::Config = database_url().parse().unwrap();
        let mut config = tokio_postgres::Config::new();
        config.host("127.0.0.1").port(self.port());
        if let Some(user) = url.get_user() {
            config.user(user);
        }
        if let Some(password) = url.get_password() {
            config.password(password);
        }
        if let Some(dbname) = url.get_dbname() {
            config.dbname(dbname);
        }
        config.options(format!("-c search_path={schema}"));
        config.application_name(schema);
        config.connect_timeout(Duration::from_secs(5));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(max_size)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

/// Finds `pattern` in `tail ++ chunk`; returns the offset in `chunk` where it ends and
/// where it starts (saturating at 0: a pattern begun in an earlier chunk starts at 0).
fn find(tail: &[u8], chunk: &[u8], pattern: &[u8]) -> Option<(usize, usize)> {
    let mut joined = tail.to_vec();
    joined.extend_from_slice(chunk);
    // Only matches that end in this chunk: the tail was already forwarded.
    let first = (tail.len() + 1).saturating_sub(pattern.len());
    let start = first
        + joined[first..]
            .windows(pattern.len())
            .position(|w| w == pattern)?;
    let end = start + pattern.len() - tail.len();
    Some((start.saturating_sub(tail.len()), end))
}

async fn relay(shared: Arc<Shared>, client: TcpStream) {
    let mut cut = shared.cut_all.subscribe();
    cut.borrow_and_update();
    let Ok(Ok(server)) =
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(shared.upstream)).await
    else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set before a matched message goes out: nothing the server says afterwards is relayed.
    let frozen = Arc::new(AtomicBool::new(false));

    let upstream = {
        let shared = Arc::clone(&shared);
        let frozen = Arc::clone(&frozen);
        async move {
            let mut buf = vec![0; 64 * 1024];
            let mut tail: Vec<u8> = Vec::new();
            loop {
                let n = match client_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &buf[..n];
                let matched = {
                    let mut rule = shared.rule.lock().unwrap();
                    let found = rule
                        .as_ref()
                        .and_then(|r| find(&tail, chunk, &r.pattern).map(|at| (at, r.forward)));
                    if found.is_some() {
                        *rule = None;
                    }
                    let keep = rule.as_ref().map_or(0, |r| r.pattern.len());
                    tail.extend_from_slice(chunk);
                    let drop_to = tail.len().saturating_sub(keep.max(32));
                    tail.drain(..drop_to);
                    found
                };
                match matched {
                    Some(((_, end), true)) => {
                        frozen.store(true, Ordering::SeqCst);
                        let _ = server_write.write_all(&chunk[..end]).await;
                        let _ = server_write.flush().await;
                        // Let the server read and act on it before the link goes.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        shared.fired.add_permits(1);
                        return;
                    }
                    Some(((start, _), false)) => {
                        frozen.store(true, Ordering::SeqCst);
                        let _ = server_write.write_all(&chunk[..start]).await;
                        shared.fired.add_permits(1);
                        return;
                    }
                    None => {
                        if server_write.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    };
    let downstream = {
        let frozen = Arc::clone(&frozen);
        async move {
            let mut buf = vec![0; 64 * 1024];
            loop {
                let n = match server_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if frozen.load(Ordering::SeqCst) {
                    // Drained, not relayed: the client never learns the answer.
                    continue;
                }
                if client_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    // The first side to end (or a cut) ends the connection: both sockets are dropped.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
        _ = cut.changed() => {}
    }
}
