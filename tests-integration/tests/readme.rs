//! The README and the quickstarts guide show the code as it is: each quickstart is its file
//! in `examples/` (compiled: `cargo test --all-features` builds every example), and each
//! command is one the repository runs (`.ci/run`) or that names an example and the features
//! it requires.

use std::path::Path;

fn repo(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The code blocks of `markdown` that follow a `<!-- examples/... -->` marker, with the
/// marked path.
fn marked_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("<!-- examples/") {
        rest = &rest[at + "<!-- ".len()..];
        let (path, after) = rest
            .split_once(" -->\n")
            .expect("a marker ends with ` -->`");
        let block = after
            .strip_prefix("```rust,ignore\n")
            .or_else(|| after.strip_prefix("```rust,no_run\n"))
            .unwrap_or_else(|| panic!("{path}: the marker is not followed by a rust block"));
        let code = &block[..block.find("```\n").expect("the block ends")];
        blocks.push((path.to_owned(), code.to_owned()));
    }
    blocks
}

/// The lines of each `sh` block of `markdown`.
fn shell_lines(markdown: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("```sh\n") {
        rest = &rest[at + "```sh\n".len()..];
        let end = rest.find("```\n").expect("the block ends");
        lines.extend(rest[..end].lines().map(str::to_owned));
        rest = &rest[end..];
    }
    lines
}

#[test]
fn every_quickstart_shown_is_its_example_file() {
    let mut shown = Vec::new();
    for document in ["README.md", "docs/quickstarts.md"] {
        for (path, code) in marked_blocks(&repo(document)) {
            // The file's own doc comment (which names it) is not shown.
            let file_code: String = repo(&path)
                .lines()
                .skip_while(|line| line.starts_with("//!") || line.is_empty())
                .flat_map(|line| [line, "\n"])
                .collect();
            assert_eq!(code, file_code, "{document}'s block differs from {path}");
            shown.push(path);
        }
    }
    shown.sort();
    assert_eq!(
        shown,
        [
            "examples/quickstart_mysql.rs",
            "examples/quickstart_postgres.rs",
            "examples/quickstart_sqlite.rs",
            "examples/quickstart_sqlx.rs",
        ],
        "each quickstart is shown once"
    );
}

/// The part of `markdown` under the heading `title`, up to the next heading of its level.
fn section<'a>(markdown: &'a str, title: &str) -> &'a str {
    let start = markdown
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section {title:?}"));
    let rest = &markdown[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |at| at + 3);
    &rest[..end]
}

#[test]
fn the_readme_s_two_commands_are_the_ones_ci_runs() {
    let readme = repo("README.md");
    let commands = shell_lines(section(&readme, "The two commands"));
    assert_eq!(
        commands,
        [
            "cargo run --example orders --no-default-features --features sqlite",
            "cargo test --all-features",
        ]
    );
    let ci = repo(".ci/run");
    // The crate count and OpenSSL check runs on the run command's build graph.
    let run = commands[0].replacen("cargo run", "cargo build", 1);
    let quoted = format!("run_command=({run})");
    assert!(ci.contains(&quoted), ".ci/run does not check `{run}`");
    assert!(
        ci.contains(&format!("timeout --kill-after=30 1200 {}", commands[1])),
        ".ci/run does not run `{}`",
        commands[1]
    );
}

/// Each `cargo run --example NAME [--no-default-features] [--features F]` the README and
/// the guide show names an example that exists and turns on the features it requires.
#[test]
fn every_run_command_shown_builds_its_example() {
    let manifest = repo("Cargo.toml");
    for document in ["README.md", "docs/quickstarts.md"] {
        let text = repo(document);
        let mut rest = text.as_str();
        let mut seen = 0;
        while let Some(at) = rest.find("cargo run --example ") {
            rest = &rest[at..];
            let end = rest.find(['`', '\n']).unwrap_or(rest.len());
            let command = &rest[..end];
            rest = &rest[end..];
            let words: Vec<&str> = command.split_whitespace().collect();
            let name = words[3];
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("../examples/{name}.rs"))
                    .is_file(),
                "{document}: `{command}` names no example"
            );
            let defaults = !words.contains(&"--no-default-features");
            let features: Vec<&str> = words
                .iter()
                .position(|word| *word == "--features")
                .map(|at| words[at + 1].split(',').collect())
                .unwrap_or_default();
            // `required-features` of the example, from the manifest.
            let required: Vec<String> = manifest
                .split("[[example]]")
                .skip(1)
                .find(|section| section.contains(&format!("name = \"{name}\"")))
                .and_then(|section| section.lines().find(|l| l.starts_with("required-features")))
                .map(|line| {
                    line.split('"')
                        .skip(1)
                        .step_by(2)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            for feature in &required {
                let on = features.contains(&feature.as_str())
                    || (defaults && ["deadpool", "postgres"].contains(&feature.as_str()));
                assert!(on, "{document}: `{command}` lacks feature {feature}");
            }
            seen += 1;
        }
        assert!(seen > 0, "{document} shows no run command");
    }
}

/// The README's gateway commands install and run the binary the manifest declares, behind
/// the feature it names.
#[test]
fn the_gateway_commands_name_the_binary_and_its_feature() {
    let readme = repo("README.md");
    let commands = shell_lines(section(&readme, "The gateway: any language"));
    assert_eq!(
        commands,
        [
            "cargo install axum-idempotency --features gateway",
            "UPSTREAM_URL=http://127.0.0.1:9000 idempotency-gateway",
        ]
    );
    let manifest = repo("Cargo.toml");
    let bin = manifest.split("[[bin]]").nth(1).expect("a [[bin]] section");
    assert!(bin.contains("name = \"idempotency-gateway\""), "{bin}");
    assert!(bin.contains("required-features = [\"gateway\"]"), "{bin}");
    assert!(manifest.contains("\ngateway = ["), "the feature exists");
}

/// The guide's table of settings is what the gateway reads: every row a variable its
/// configuration reads, every variable it reads a row (or, for `CONSOLE_TOKEN` and
/// `RUST_LOG`, named in the guide).
#[test]
fn the_gateway_guide_lists_every_setting_the_gateway_reads() {
    let guide = repo("docs/gateway.md");
    let rows: Vec<&str> = guide
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once("` |"))
        .map(|(name, _)| name)
        .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    let config = repo("src/bin/idempotency-gateway/config.rs");
    let code = &config[..config.find("#[cfg(test)]").unwrap_or(config.len())];
    let mut read: Vec<&str> = code
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|text| text.len() > 3 && text.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    read.sort_unstable();
    read.dedup();
    for name in &rows {
        assert!(
            read.contains(name),
            "the guide lists {name}, which the gateway does not read"
        );
    }
    for name in &read {
        assert!(
            rows.contains(name) || guide.contains(&format!("`{name}`")),
            "the gateway reads {name}, which the guide does not name"
        );
    }
    assert_eq!(rows.len(), 16, "{rows:?}");
}
