//! A network between the benchmark and its database: a TCP proxy on loopback that delays
//! every chunk, in each direction, by a fixed time (`--network-delay-us`, default 500 µs each
//! way, so a round trip gains about 1 ms). This kernel has no `netem`, and tokio's timer has
//! a granularity of 1 ms, so each direction of each connection is two OS threads: one reads
//! a chunk and stamps it with its deadline, the other sleeps until that instant (to tens of
//! microseconds, `nanosleep`) and writes it. Chunks are forwarded as they arrive, in order,
//! with `TCP_NODELAY` on both sides: the proxy adds latency, it does not throttle.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The name the proxy's threads carry, so their CPU time can be read from `/proc`.
const THREAD_NAME: &str = "delay-proxy";

/// Starts a proxy to `upstream` that delays each direction by `delay`; returns the address
/// it listens on.
pub(crate) fn start(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the delay proxy");
    let addr = listener.local_addr().unwrap();
    std::thread::Builder::new()
        .name(THREAD_NAME.to_owned())
        .spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for stream in [&client, &server] {
                    stream.set_nodelay(true).unwrap();
                }
                forward(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    delay,
                );
                forward(server, client, delay);
            }
        })
        .unwrap();
    addr
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
fn forward(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, delayed) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::Builder::new()
        .name(THREAD_NAME.to_owned())
        .spawn(move || {
            let mut buffer = vec![0; 64 << 10];
            loop {
                match from.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if chunks
                            .send((Instant::now() + delay, buffer[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        })
        .unwrap();
    std::thread::Builder::new()
        .name(THREAD_NAME.to_owned())
        .spawn(move || {
            while let Ok((due, chunk)) = delayed.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })
        .unwrap();
}

/// CPU seconds (user + system) the proxy's threads have used so far, from `/proc`.
pub(crate) fn cpu_seconds() -> f64 {
    let ticks_per_second = 100.0; // USER_HZ on Linux
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut ticks = 0u64;
    for task in tasks.flatten() {
        let path = task.path();
        let is_proxy = std::fs::read_to_string(path.join("comm"))
            .is_ok_and(|name| name.trim_end() == THREAD_NAME);
        if !is_proxy {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(path.join("stat")) {
            // The fields after the command's closing parenthesis; utime and stime are the
            // 12th and 13th of them.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or("", |(_, rest)| rest)
                .split_whitespace()
                .collect();
            ticks += fields
                .get(11)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
            ticks += fields
                .get(12)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ticks as f64 / ticks_per_second
}
