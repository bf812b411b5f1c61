//! Creates one order through [`IdempotencyMiddleware`]: the caller's side of
//! `examples/orders.rs`. One key for the order, reused by every retry; a lost answer is
//! retried and comes back as a replay, never as a second order.
//!
//! ```text
//! cargo run --example orders &
//! cargo run --example order_client --features client -- \
//!     --url http://127.0.0.1:3000 --user 1001 --amount 299
//! ```
//!
//! Prints the final answer's status line and JSON body on stdout, `replayed=true|false
//! tries=N` on stderr, and exits 0 on a 2xx answer, 1 otherwise. `HTTP_TIMEOUT_MS` (default
//! 2000) bounds each try.

use std::process::ExitCode;
use std::time::Duration;

use axum_idempotency::client::{ClientError, IdempotencyMiddleware, IdempotentResponseExt};

/// The command line: `--url`, `--user`, `--amount`.
struct Args {
    url: String,
    user: i64,
    amount: i64,
}

fn args() -> Result<Args, String> {
    let mut url = None;
    let mut user = None;
    let mut amount = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => url = Some(value),
            "--user" => user = Some(value.parse().map_err(|_| "--user must be an integer")?),
            "--amount" => amount = Some(value.parse().map_err(|_| "--amount must be an integer")?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        url: url.ok_or("--url is required")?,
        user: user.ok_or("--user is required")?,
        amount: amount.ok_or("--amount is required")?,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("order_client: {message}");
            eprintln!("usage: order_client --url URL --user ID --amount N");
            return ExitCode::from(2);
        }
    };
    let timeout_ms = match std::env::var("HTTP_TIMEOUT_MS") {
        Ok(value) => match value.parse::<u64>() {
            Ok(ms) => ms,
            Err(_) => {
                eprintln!("order_client: HTTP_TIMEOUT_MS must be a number of milliseconds");
                return ExitCode::from(2);
            }
        },
        Err(_) => 2000,
    };
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_millis(timeout_ms))
        .build()
    {
        Ok(http) => http,
        Err(error) => {
            eprintln!("order_client: {error}");
            return ExitCode::FAILURE;
        }
    };
    let client = reqwest_middleware::ClientBuilder::new(http)
        .with(IdempotencyMiddleware::new())
        .build();

    let body = serde_json::json!({ "user_id": args.user, "amount": args.amount });
    let sent = client
        .post(format!("{}/orders", args.url.trim_end_matches('/')))
        .header("content-type", "application/json")
        .header("x-user-id", args.user.to_string())
        .body(body.to_string())
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            let tries = ClientError::find(&error).map_or(1, ClientError::tries);
            eprintln!("order_client: {}", chain(&error));
            eprintln!("replayed=false tries={tries}");
            return ExitCode::FAILURE;
        }
    };
    let status = response.status();
    let (replayed, tries) = response
        .idempotency()
        .map_or((response.is_replayed(), 1), |outcome| {
            (outcome.replayed(), outcome.tries())
        });
    println!("{:?} {status}", response.version());
    match response.text().await {
        Ok(text) => println!("{text}"),
        Err(error) => eprintln!("order_client: reading the body: {}", chain(&error)),
    }
    eprintln!("replayed={replayed} tries={tries}");
    if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// An error and its causes on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}
