//! Talking to an example service as a user does: raw HTTP/1.1 over TCP, one exchange per
//! connection.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.1 exchange; returns status and body.
pub async fn http(addr: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `POST /orders` of the orders example as user 1001, under `key`.
pub fn post_order(key: &str, amount: i64) -> String {
    let body = format!(r#"{{"user_id": 1001, "amount": {amount}}}"#);
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\n\
         x-user-id: 1001\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// `POST /orders/{order_no}/pay` as user 1001, under `key` if there is one.
pub fn pay(order_no: &str, key: Option<&str>) -> String {
    let key = key.map_or(String::new(), |key| format!("idempotency-key: {key}\r\n"));
    format!(
        "POST /orders/{order_no}/pay HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{key}\
         x-user-id: 1001\r\ncontent-length: 0\r\n\r\n"
    )
}

/// The count of `idempotency_requests_total` with this outcome in a `/metrics` text.
pub fn metric(text: &str, outcome: &str) -> u64 {
    let prefix = format!("idempotency_requests_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |value| value.trim().parse().unwrap())
}
