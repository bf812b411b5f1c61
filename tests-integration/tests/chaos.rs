//! A short run of the chaos example (`examples/chaos.rs`): duplicate retries, client
//! timeouts, cut connections, killed backends and handler 503s, then the invariants checked
//! against the database.

mod common;

use common::example_binary;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn chaos_run_executes_every_key_once_and_replays_every_answer() {
    let started = Instant::now();
    // DATABASE_URL, if set, is inherited.
    let output = Command::new(example_binary("chaos"))
        .args([
            "--keys",
            "300",
            "--concurrency",
            "16",
            "--seconds",
            "20",
            "--seed",
            "6",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "chaos run failed: {:?}\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the chaos run overran its cap"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one summary line expected: {stdout}");
    let summary: HashMap<&str, &str> = lines[0]
        .split_whitespace()
        .filter_map(|field| field.split_once('='))
        .collect();
    let count = |name: &str| -> u64 {
        summary
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {stdout}"))
            .parse()
            .unwrap()
    };
    assert_eq!(count("keys"), 300, "{stdout}");
    assert_eq!(count("duplicates"), 0, "{stdout}");
    assert_eq!(count("lost"), 0, "{stdout}");
    assert_eq!(count("mismatched_replays"), 0, "{stdout}");
    assert_eq!(count("unresolved"), 0, "{stdout}");
    assert!(count("faults") > 0, "no fault was injected: {stdout}");
    assert!(count("retries") > 0, "{stdout}");
}
