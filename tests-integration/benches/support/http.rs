//! A keep-alive HTTP/1.1 client as light as the benchmarks need: one connection, one
//! request at a time, the answer's status read and its body skipped.

use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One connection to a server under test.
pub(crate) struct Connection {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl Connection {
    pub(crate) async fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (read, writer) = stream.into_split();
        Self {
            reader: BufReader::new(read),
            writer,
        }
    }

    pub(crate) async fn post(&mut self, path: &str, key: Option<&str>, body: &str) -> u16 {
        let key = key
            .map(|k| format!("idempotency-key: {k}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n{key}\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.writer.write_all(request.as_bytes()).await.unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).await.unwrap();
        let status: u16 = line[9..12].parse().unwrap();
        let mut length = 0;
        loop {
            line.clear();
            self.reader.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).await.unwrap();
        status
    }
}
