//! The reverse proxy: the request as the upstream gets it, the answer as the client gets
//! it, and what went wrong in between.
//!
//! Hop-by-hop headers, and those the `Connection` header names, are dropped both ways
//! (RFC 9110 §7.6.1); `Host` is the upstream's; the client's address is appended to
//! `X-Forwarded-For`; everything else passes.

use std::net::IpAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{CONNECTION, HOST};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The header the gateway adds to a guarded request: the key's fencing token.
pub(crate) const FENCING_TOKEN: HeaderName = HeaderName::from_static("idempotency-fencing-token");

/// Headers that describe one connection, never the message (RFC 9110 §7.6.1), and
/// `Proxy-Connection`, which old clients still send.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Why there is no answer from the upstream.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection was made: nothing was sent.
    Refused(hyper_util::client::legacy::Error),
    /// The whole answer did not arrive in time; the request may have been acted on.
    TimedOut,
    /// The connection failed after the request was sent; it may have been acted on.
    Closed(axum::BoxError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(e) => write!(f, "could not connect: {}", chain(e)),
            Self::TimedOut => f.write_str("no whole answer in time"),
            Self::Closed(e) => write!(
                f,
                "the connection failed after the request was sent: {}",
                chain(&**e)
            ),
        }
    }
}

/// An error and its sources, on one line.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

/// The upstream service and the client that reaches it.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, Body>,
    base: Uri,
    host: HeaderValue,
    timeout: Duration,
}

impl Upstream {
    /// The upstream at `base` (`http://host:port[/prefix]`); `timeout` bounds each answer.
    pub(crate) fn new(base: Uri, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let host = HeaderValue::from_str(base.authority().map_or("", |a| a.as_str()))
            .expect("an authority is a header value");
        Self {
            client,
            base,
            host,
            timeout,
        }
    }

    /// `request` as the upstream gets it, from the client at `peer`.
    pub(crate) fn outgoing(&self, request: Request<Body>, peer: Option<IpAddr>) -> Request<Body> {
        let (mut parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let prefix = self.base.path().trim_end_matches('/');
        let target = format!(
            "{}://{}{prefix}{path}",
            self.base.scheme_str().unwrap_or("http"),
            self.base.authority().map_or("", |a| a.as_str()),
        );
        parts.uri = target.parse().unwrap_or_else(|_| self.base.clone());
        parts.version = Version::HTTP_11;
        drop_hop_by_hop(&mut parts.headers);
        // Only the gateway says what a key's fencing token is.
        parts.headers.remove(FENCING_TOKEN);
        parts.headers.insert(HOST, self.host.clone());
        if let Some(peer) = peer {
            append_forwarded_for(&mut parts.headers, peer);
        }
        Request::from_parts(parts, body)
    }

    /// Sends `request` and reads the whole answer within the timeout.
    pub(crate) async fn send_buffered(
        &self,
        request: Request<Body>,
    ) -> Result<Response<Body>, Failure> {
        let exchange = async {
            let response = self.client.request(request).await.map_err(classify)?;
            let (mut parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| Failure::Closed(e.into()))?
                .to_bytes();
            drop_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(parts, Body::from(body)))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(Err(Failure::TimedOut))
    }

    /// Sends `request`; the answer's head arrives within the timeout, its body streams.
    pub(crate) async fn send_streaming(
        &self,
        request: Request<Body>,
    ) -> Result<Response<Body>, Failure> {
        let response = tokio::time::timeout(self.timeout, self.client.request(request))
            .await
            .map_err(|_| Failure::TimedOut)?
            .map_err(classify)?;
        let (mut parts, body) = response.into_parts();
        drop_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(parts, Body::new(body)))
    }
}

fn classify(error: hyper_util::client::legacy::Error) -> Failure {
    if error.is_connect() {
        Failure::Refused(error)
    } else {
        Failure::Closed(error.into())
    }
}

/// Removes the hop-by-hop headers and those `Connection` names.
pub(crate) fn drop_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    // `Upgrade` is hop-by-hop too; the gateway does not switch protocols.
    headers.remove("upgrade");
}

fn append_forwarded_for(headers: &mut HeaderMap, peer: IpAddr) {
    const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    let earlier: Vec<&str> = headers
        .get_all(&FORWARDED_FOR)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    let value = if earlier.is_empty() {
        peer.to_string()
    } else {
        format!("{}, {peer}", earlier.join(", "))
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(FORWARDED_FOR, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(base: &str) -> Upstream {
        Upstream::new(base.parse().unwrap(), Duration::from_secs(1))
    }

    #[test]
    fn the_upstream_gets_its_host_its_prefix_and_no_hop_by_hop_header() {
        let request = Request::post("http://gateway.example/orders?x=1")
            .header("host", "gateway.example")
            .header("connection", "keep-alive, X-Secret")
            .header("keep-alive", "timeout=5")
            .header("x-secret", "hop")
            .header("te", "trailers")
            .header("transfer-encoding", "chunked")
            .header("upgrade", "h2c")
            .header("idempotency-fencing-token", "999")
            .header("idempotency-key", "k-1")
            .header("x-forwarded-for", "10.0.0.1")
            .header("authorization", "Bearer t")
            .body(Body::empty())
            .unwrap();
        let out =
            upstream("http://10.1.2.3:9000/api/").outgoing(request, Some([127, 0, 0, 1].into()));
        assert_eq!(out.uri(), "http://10.1.2.3:9000/api/orders?x=1");
        let h = out.headers();
        assert_eq!(h["host"], "10.1.2.3:9000");
        for gone in [
            "connection",
            "keep-alive",
            "x-secret",
            "te",
            "transfer-encoding",
            "upgrade",
            "idempotency-fencing-token",
        ] {
            assert!(!h.contains_key(gone), "{gone} is dropped");
        }
        assert_eq!(h["idempotency-key"], "k-1");
        assert_eq!(h["authorization"], "Bearer t");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
    }

    #[test]
    fn a_first_forwarded_for_is_the_client() {
        let request = Request::get("/").body(Body::empty()).unwrap();
        let out = upstream("http://u:1").outgoing(request, Some("::1".parse().unwrap()));
        assert_eq!(out.headers()["x-forwarded-for"], "::1");
        assert_eq!(out.uri(), "http://u:1/");
    }
}
