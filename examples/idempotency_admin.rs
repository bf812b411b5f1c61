//! A troubleshooting tool over [`axum_idempotency::Admin`]: the troubleshooting checklist from
//! the command line.
//!
//! ```text
//! cargo run --example idempotency_admin -- show <key> [--scope S]
//! cargo run --example idempotency_admin -- stale [--limit N]
//! cargo run --example idempotency_admin -- message <group> <message_id>
//! cargo run --example idempotency_admin -- failed <group> [--limit N]
//! cargo run --example idempotency_admin -- purge
//! ```
//!
//! The database comes from `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`);
//! set its `search_path` with `?options=-c%20search_path%3Dmyschema` if the tables live in
//! another schema. Exits with 1 on bad arguments or when the record is not found.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum_idempotency::postgres::PgStore;
use axum_idempotency::{Admin, MessageInfo, RecordInfo};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

const USAGE: &str = "usage:
  idempotency_admin show <key> [--scope S]     a key's record (key as sent in the header)
  idempotency_admin stale [--limit N]          PROCESSING records past their lease, oldest first
  idempotency_admin message <group> <id>       a consumed message's inbox record
  idempotency_admin failed <group> [--limit N] a consumer group's failed messages
  idempotency_admin purge                      delete expired records now (default retention)

DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/postgres";

/// A parsed command line.
#[derive(Debug)]
enum Command {
    Show { key: String, scope: String },
    Stale { limit: i64 },
    Message { group: String, message_id: String },
    Failed { group: String, limit: i64 },
    Purge,
}

fn parse(args: &[String]) -> Result<Command, String> {
    let (command, rest) = args.split_first().ok_or("no command given")?;
    let mut positional = Vec::new();
    let mut scope = None;
    let mut limit = None;
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--scope" => {
                scope = Some(rest.next().ok_or("--scope needs a value")?.clone());
            }
            "--limit" => {
                let value = rest.next().ok_or("--limit needs a value")?;
                let value: i64 = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--limit needs a positive number, not {value:?}"))?;
                limit = Some(value);
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            value => positional.push(value.to_owned()),
        }
    }
    let allow = |scope_ok: bool, limit_ok: bool| -> Result<(), String> {
        if scope.is_some() && !scope_ok {
            return Err(format!("{command} takes no --scope"));
        }
        if limit.is_some() && !limit_ok {
            return Err(format!("{command} takes no --limit"));
        }
        Ok(())
    };
    let command = match (command.as_str(), positional.as_slice()) {
        ("show", [key]) => {
            allow(true, false)?;
            Command::Show {
                key: key.clone(),
                scope: scope.clone().unwrap_or_default(),
            }
        }
        ("stale", []) => {
            allow(false, true)?;
            Command::Stale {
                limit: limit.unwrap_or(20),
            }
        }
        ("message", [group, message_id]) => {
            allow(false, false)?;
            Command::Message {
                group: group.clone(),
                message_id: message_id.clone(),
            }
        }
        ("failed", [group]) => {
            allow(false, true)?;
            Command::Failed {
                group: group.clone(),
                limit: limit.unwrap_or(20),
            }
        }
        ("purge", []) => {
            allow(false, false)?;
            Command::Purge
        }
        ("show" | "stale" | "message" | "failed" | "purge", _) => {
            return Err(format!("wrong number of arguments for {command}"));
        }
        _ => return Err(format!("unknown command {command:?}")),
    };
    Ok(command)
}

fn pool(url: &str) -> Result<Pool, String> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| format!("DATABASE_URL is not a valid connection string: {e}"))?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(2)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .map_err(|e| e.to_string())
}

/// `2024-05-01T12:34:56.789Z`: RFC 3339 in UTC, to the millisecond.
fn rfc3339(time: SystemTime) -> String {
    let (sign, since) = match time.duration_since(UNIX_EPOCH) {
        Ok(since) => (1, since),
        Err(before) => (-1, before.duration()),
    };
    let millis = sign * since.as_millis() as i128;
    let secs = millis.div_euclid(1000) as i64;
    let millis = millis.rem_euclid(1000);
    let (days, secs_of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        secs_of_day / 3600,
        secs_of_day % 3600 / 60,
        secs_of_day % 60
    )
}

/// `in 5m 3s` / `4m 1s ago`, relative to now.
fn relative(time: SystemTime) -> String {
    fn span(d: Duration) -> String {
        let s = d.as_secs();
        match s {
            0..60 => format!("{s}s"),
            60..3600 => format!("{}m {}s", s / 60, s % 60),
            3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
            _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
        }
    }
    match time.duration_since(SystemTime::now()) {
        Ok(ahead) => format!("in {}", span(ahead)),
        Err(behind) => format!("{} ago", span(behind.duration())),
    }
}

fn when(time: SystemTime) -> String {
    format!("{} ({})", rfc3339(time), relative(time))
}

fn print_record(record: &RecordInfo) {
    let expired = record.expires_at <= SystemTime::now();
    println!("id            {}", record.id);
    println!("scope         {:?}", record.scope);
    if let Some(key) = &record.key {
        println!("key           {key:?}");
    }
    let retry = match (record.state.as_str(), record.retryable) {
        ("FAILED", true) => " (retryable: the next retry runs again)",
        ("FAILED", false) => " (final: retries get the stored answer)",
        _ => "",
    };
    println!("state         {}{retry}", record.state);
    println!("status        {}", record.status);
    println!("fingerprint   {}", record.fingerprint);
    println!("fencing token {}", record.fencing_token);
    if let Some(until) = record.locked_until {
        println!("lease until   {}", when(until));
    }
    println!("created       {}", when(record.created_at));
    println!("updated       {}", when(record.updated_at));
    println!(
        "expires       {}{}",
        when(record.expires_at),
        if expired {
            " — expired: ignored, the key can be used again"
        } else {
            ""
        }
    );
    println!("response      {} bytes", record.response_bytes);
}

fn print_message(message: &MessageInfo) {
    println!("group         {}", message.consumer_group);
    println!("message id    {}", message.message_id);
    println!("status        {}", message.status);
    println!("attempts      {}", message.attempts);
    if let Some(error) = &message.last_error {
        println!("last error    {error}");
    }
    if let Some(digest) = &message.payload_digest {
        println!("payload sha256 {digest}");
    }
    println!("created       {}", when(message.created_at));
    println!("updated       {}", when(message.updated_at));
    println!("expires       {}", when(message.expires_at));
}

async fn run(
    admin: &Admin<PgStore>,
    command: Command,
) -> Result<ExitCode, axum_idempotency::Error> {
    match command {
        Command::Show { key, scope } => match admin.lookup(&scope, &key).await? {
            Some(record) => print_record(&record),
            None => {
                eprintln!(
                    "no record for this key in scope {scope:?}: the request never committed, \
                     it was purged, or the scope is wrong (--scope)"
                );
                return Ok(ExitCode::FAILURE);
            }
        },
        Command::Stale { limit } => {
            let records = admin.stale(limit).await?;
            if records.is_empty() {
                println!("no PROCESSING record is past its lease");
            }
            for (n, record) in records.iter().enumerate() {
                if n > 0 {
                    println!();
                }
                print_record(record);
            }
        }
        Command::Message { group, message_id } => {
            match admin.inbox_message(&group, &message_id).await? {
                Some(message) => print_message(&message),
                None => {
                    eprintln!("no inbox record for message {message_id:?} in group {group:?}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        Command::Failed { group, limit } => {
            let messages = admin.failed_messages(&group, limit).await?;
            if messages.is_empty() {
                println!("no failed message in group {group:?}");
            }
            for (n, message) in messages.iter().enumerate() {
                if n > 0 {
                    println!();
                }
                print_message(message);
            }
        }
        Command::Purge => {
            let report = admin.purge_now().await?;
            println!("purged records     {}", report.purged_records);
            println!("purged messages    {}", report.purged_messages);
            println!("stale PROCESSING   {}", report.stale_processing);
            if let Some(oldest) = report.oldest_stale {
                println!("oldest past lease  {}s", oldest.as_secs());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The error and its sources, one per line.
fn report(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(&format!("\n  caused by: {cause}"));
        source = cause.source();
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(
        args.first().map(String::as_str),
        Some("-h" | "--help" | "help")
    ) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let command = match parse(&args) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let pool = match pool(&url) {
        Ok(pool) => pool,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::FAILURE;
        }
    };
    match run(&Admin::new(pool), command).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", report(&error));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_timestamps() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.789Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
        let t = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339(t), "1969-12-31T23:59:59.000Z");
    }

    #[test]
    fn parses_commands() {
        let args = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert!(matches!(
            parse(&args("show k1 --scope alice")),
            Ok(Command::Show { key, scope }) if key == "k1" && scope == "alice"
        ));
        assert!(matches!(
            parse(&args("stale --limit 5")),
            Ok(Command::Stale { limit: 5 })
        ));
        assert!(matches!(
            parse(&args("failed g")),
            Ok(Command::Failed { limit: 20, .. })
        ));
        for bad in [
            "",
            "show",
            "show a b",
            "stale --limit",
            "stale --limit x",
            "stale --scope s",
            "purge now",
            "frobnicate",
            "message g",
            "show k --bogus",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?} was accepted");
        }
    }
}
