//! The monitoring mixin under `monitoring/` against the crate's metric names: every metric
//! the dashboard and the alerting rules query is one the crate emits, the dashboard shows
//! every metric the crate emits, and every alert links to a runbook section of
//! `docs/monitoring.md` that exists. Needs no database. (`monitoring/check.sh` runs
//! promtool over the rules and their unit tests.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use regex::Regex;
use serde_json::Value;

const DASHBOARD: &str = "monitoring/dashboard.json";
const ALERTS: &str = "monitoring/alerts.yml";
const GUIDE: &str = "docs/monitoring.md";
/// Where the crate's metric names are defined, as `pub(crate) const NAME: &str = "...";`.
const TELEMETRY: &str = "src/engine/telemetry.rs";

/// How a metric is exposed. A histogram is scraped as `<name>_bucket`, `<name>_sum` and
/// `<name>_count`; every other metric under its own name (counters already end in
/// `_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Histogram,
    Other,
}

fn read(relative: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

/// The metrics the crate emits, by name.
///
/// Read from the text of the telemetry module for now: its `const`s with an
/// `idempotency_` name, a histogram being one recorded with `histogram!(CONST ...)`. When
/// the crate exports its list of metrics, this is the one function to change.
fn crate_metrics() -> BTreeMap<String, Kind> {
    let source = read(TELEMETRY);
    let constant = Regex::new(
        r#"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?const\s+([A-Z0-9_]+)\s*:\s*&(?:'static\s+)?str\s*=\s*"(idempotency_[a-z0-9_]+)"\s*;"#,
    )
    .unwrap();
    let recorded_as_histogram = Regex::new(r"histogram!\(\s*([A-Z0-9_]+)").unwrap();
    let histograms: BTreeSet<&str> = recorded_as_histogram
        .captures_iter(&source)
        .map(|captures| captures.get(1).unwrap().as_str())
        .collect();
    let metrics: BTreeMap<String, Kind> = constant
        .captures_iter(&source)
        .map(|captures| {
            let kind = if histograms.contains(&captures[1]) {
                Kind::Histogram
            } else {
                Kind::Other
            };
            (captures[2].to_owned(), kind)
        })
        .collect();
    assert!(
        !metrics.is_empty(),
        "no `const ...: &str = \"idempotency_...\"` found in {TELEMETRY}"
    );
    assert!(
        metrics.values().any(|kind| *kind == Kind::Histogram),
        "no metric of {TELEMETRY} is recorded with `histogram!(CONST, ...)`"
    );
    metrics
}

/// Every `expr` of the dashboard: panel targets, in rows or not.
fn dashboard_exprs() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD))
        .unwrap_or_else(|error| panic!("{DASHBOARD} is not valid JSON: {error}"));
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(!exprs.is_empty(), "{DASHBOARD} has no expr");
    exprs
}

fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(value, out),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                collect_exprs(item, out);
            }
        }
        _ => {}
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Every `expr` of the rules file, read as text: a plain scalar on the key's line, or a
/// block scalar (`|`, `>`) on the more indented lines below it.
fn alert_exprs() -> Vec<String> {
    let text = read(ALERTS);
    let lines: Vec<&str> = text.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(value) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let mut block = String::new();
            while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > indent(line))
            {
                block.push_str(lines[i].trim());
                block.push('\n');
                i += 1;
            }
            exprs.push(block);
        } else {
            let unquoted = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .map(|v| v.replace("''", "'"))
                .or_else(|| {
                    value
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .map(|v| v.replace("\\\"", "\""))
                })
                .unwrap_or_else(|| value.to_owned());
            exprs.push(unquoted);
        }
    }
    assert!(!exprs.is_empty(), "{ALERTS} has no expr");
    exprs
}

/// The metric names an expression queries, histogram series folded into their histogram.
/// String literals (label values such as `table="idempotency_records"`) are left out.
fn metric_names(expr: &str, metrics: &BTreeMap<String, Kind>) -> BTreeSet<String> {
    let strings = Regex::new(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"#).unwrap();
    let name = Regex::new(r"idempotency_[a-z_]+").unwrap();
    let code = strings.replace_all(expr, "\"\"");
    name.find_iter(&code)
        .map(|found| {
            let found = found.as_str();
            ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| found.strip_suffix(suffix))
                .find(|base| metrics.get(*base) == Some(&Kind::Histogram))
                .unwrap_or(found)
                .to_owned()
        })
        .collect()
}

#[test]
fn dashboard_and_alerts_query_only_metrics_the_crate_emits() {
    let metrics = crate_metrics();
    let mut unknown = Vec::new();
    for (file, exprs) in [(DASHBOARD, dashboard_exprs()), (ALERTS, alert_exprs())] {
        for expr in &exprs {
            for name in metric_names(expr, &metrics) {
                if !metrics.contains_key(&name) {
                    unknown.push(format!("{file}: `{name}` in `{}`", expr.trim()));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics the crate does not emit (per {TELEMETRY}):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn dashboard_shows_every_metric_the_crate_emits() {
    let metrics = crate_metrics();
    let shown: BTreeSet<String> = dashboard_exprs()
        .iter()
        .flat_map(|expr| metric_names(expr, &metrics))
        .collect();
    let missing: Vec<&String> = metrics
        .keys()
        .filter(|name| !shown.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics of {TELEMETRY} that no panel of {DASHBOARD} shows: {missing:?}"
    );
}

#[test]
fn histograms_are_queried_through_their_series() {
    // A histogram is scraped only as `_bucket`/`_sum`/`_count`: its bare name matches
    // nothing (or, exported as a summary, only quantiles), so an expression must not use it.
    let metrics = crate_metrics();
    let bare = Regex::new(r"idempotency_[a-z_]+").unwrap();
    for expr in dashboard_exprs().iter().chain(alert_exprs().iter()) {
        for found in bare.find_iter(expr) {
            assert_ne!(
                metrics.get(found.as_str()),
                Some(&Kind::Histogram),
                "histogram `{}` used by its bare name in `{}`",
                found.as_str(),
                expr.trim()
            );
        }
    }
}

#[test]
fn dashboard_has_a_prometheus_datasource_variable() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no `datasource` variable of type prometheus"
    );
    fn check_datasources(value: &Value) {
        match value {
            Value::Object(map) => {
                if map.contains_key("expr") {
                    assert_eq!(
                        map.get("datasource").and_then(|d| d.get("uid")),
                        Some(&Value::String("${datasource}".to_owned())),
                        "target without the ${{datasource}} variable: {value}"
                    );
                }
                map.values().for_each(check_datasources);
            }
            Value::Array(items) => items.iter().for_each(check_datasources),
            _ => {}
        }
    }
    check_datasources(&dashboard);
}

/// The anchors of the guide's headings, as GitHub and rustdoc make them: lower case,
/// spaces to `-`, other punctuation dropped. Headings inside code blocks are not headings.
fn guide_anchors() -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut in_code = false;
    for line in read(GUIDE).lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let anchor: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        anchors.insert(anchor);
    }
    anchors
}

#[test]
fn every_alert_has_a_severity_a_summary_a_description_and_a_runbook_section() {
    let text = read(ALERTS);
    let mut alerts: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- alert:") {
            alerts.push((name.trim().to_owned(), String::new()));
        } else if let Some((_, body)) = alerts.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    assert!(!alerts.is_empty(), "{ALERTS} has no alert");
    let names: BTreeSet<&str> = alerts.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names.len(), alerts.len(), "alert names repeat");

    let severity = Regex::new(r"(?m)^\s+severity:\s*(critical|warning|info)\s*$").unwrap();
    let summary = Regex::new(r"(?m)^\s+summary:\s*\S").unwrap();
    let description = Regex::new(r"(?m)^\s+description:\s*\S").unwrap();
    let runbook =
        Regex::new(r#"(?m)^\s+runbook_url:\s*["']?docs/monitoring\.md#([a-z0-9_-]+)["']?\s*$"#)
            .unwrap();
    let anchors = guide_anchors();
    for (name, body) in &alerts {
        assert!(severity.is_match(body), "{name}: no labels.severity");
        assert!(summary.is_match(body), "{name}: no annotations.summary");
        assert!(
            description.is_match(body),
            "{name}: no annotations.description"
        );
        let anchor = runbook
            .captures(body)
            .unwrap_or_else(|| panic!("{name}: no runbook_url docs/monitoring.md#<anchor>"))[1]
            .to_owned();
        assert!(
            anchors.contains(&anchor),
            "{name}: {GUIDE} has no heading with anchor #{anchor}"
        );
    }
}
