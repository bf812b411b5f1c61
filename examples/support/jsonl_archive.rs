//! An [`ArchiveSink`] that appends the records the sweeper purges to a file of JSON lines,
//! one object a record: the orders examples use it when `ARCHIVE_JSONL` names the file.
//!
//! Each batch is appended and synced to disk before `write` returns, so the sweeper deletes
//! only what the file holds. The sweeper delivers at least once; the sink drops repeats by
//! the rows' `archive_id`, remembering the ids of the lines already in the file (read when
//! it opens: an example's archive, not a year of one — a real deployment would rotate the
//! file or let its log pipeline drop repeats by the same id).
//!
//! A line, pretty-printed:
//!
//! ```json
//! {
//!   "archive_id": "5f0c…9a1e-1764822000123456",
//!   "id": "5f0c…9a1e", "scope": "1001", "key": "order-1",
//!   "state": "SUCCESS", "retryable": false, "status": 201,
//!   "fingerprint": "9c1d…", "fencing_token": 0,
//!   "created_at": 1764822000.123456, "updated_at": 1764822000.125,
//!   "expires_at": 1764908400.123456,
//!   "response": {"headers": {"content-type": "application/json"},
//!                "body": "{\"order_no\":\"ORD-…\"}", "body_key_id": null}
//! }
//! ```
//!
//! Times are seconds since the Unix epoch. A body that is not UTF-8, or is sealed under a
//! key (`body_key_id` set), is written as `body_hex` instead of `body`. `response` is
//! `null` with `Archive::Metadata`.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::SystemTime;

use axum_idempotency::{ArchiveSink, ArchivedRow, BoxError};
use serde_json::{Map, Value, json};

/// Appends archived records to one file, dropping repeats.
pub(crate) struct JsonLines {
    path: PathBuf,
    seen: tokio::sync::Mutex<HashSet<String>>,
}

impl JsonLines {
    /// Opens (or creates) the file and reads the ids it already holds; an error names the
    /// path.
    pub(crate) fn open(path: impl Into<PathBuf>) -> Result<Self, String> {
        let path = path.into();
        let failed = |e: std::io::Error| format!("ARCHIVE_JSONL {}: {e}", path.display());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .map_err(failed)?;
        let mut seen = HashSet::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line.map_err(failed)?;
            // A line cut short by a crash mid-append has no id to remember.
            if let Ok(Value::Object(object)) = serde_json::from_str::<Value>(&line) {
                if let Some(Value::String(id)) = object.get("archive_id") {
                    seen.insert(id.clone());
                }
            }
        }
        Ok(Self {
            path,
            seen: tokio::sync::Mutex::new(seen),
        })
    }
}

impl ArchiveSink for JsonLines {
    async fn write(&self, rows: &[ArchivedRow]) -> Result<(), BoxError> {
        // One batch at a time: a repeat within a batch, or across two sweepers of this
        // process, is dropped too.
        let mut seen = self.seen.lock().await;
        let mut text = String::new();
        let mut new_ids = Vec::new();
        for row in rows {
            if seen.contains(&row.archive_id) || new_ids.contains(&row.archive_id) {
                continue;
            }
            text.push_str(&serde_json::to_string(&line(row))?);
            text.push('\n');
            new_ids.push(row.archive_id.clone());
        }
        if text.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            file.write_all(text.as_bytes())?;
            file.sync_data()
        })
        .await??;
        seen.extend(new_ids);
        Ok(())
    }
}

/// One record as a JSON object.
fn line(row: &ArchivedRow) -> Value {
    let record = &row.record;
    let response = row.response.as_ref().map(|response| {
        let mut headers = Map::new();
        for (name, value) in &response.headers {
            headers.insert(
                name.as_str().to_owned(),
                Value::String(String::from_utf8_lossy(value.as_bytes()).into_owned()),
            );
        }
        let mut object = Map::new();
        object.insert("headers".to_owned(), Value::Object(headers));
        match std::str::from_utf8(&response.body) {
            Ok(body) if response.body_key_id.is_none() => {
                object.insert("body".to_owned(), Value::String(body.to_owned()));
            }
            _ => {
                let hex = response.body.iter().map(|b| format!("{b:02x}")).collect();
                object.insert("body_hex".to_owned(), Value::String(hex));
            }
        }
        object.insert("body_key_id".to_owned(), json!(response.body_key_id));
        Value::Object(object)
    });
    json!({
        "archive_id": row.archive_id,
        "id": record.id,
        "scope": record.scope,
        "key": record.key,
        "state": record.state,
        "retryable": record.retryable,
        "status": record.status,
        "fingerprint": record.fingerprint,
        "fencing_token": record.fencing_token,
        "created_at": unix(record.created_at),
        "updated_at": unix(record.updated_at),
        "expires_at": unix(record.expires_at),
        "response": response,
    })
}

fn unix(time: SystemTime) -> f64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}
