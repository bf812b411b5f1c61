//! The crate's import rules, checked: each part of `src/` may name only the parts below it
//! (the module map in the crate docs). A line of code that names another part through
//! `crate::` must be allowed here; naming a crate-root re-export instead of the module
//! that defines the item hides the arrow, so that is refused too.
//!
//! Run alone with `cargo test --test layering`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Which parts each part may import (`lib.rs` wires them all together).
const ALLOWED: &[(&str, &[&str])] = &[
    ("engine", &[]),
    ("store", &["engine"]),
    ("postgres", &["store", "engine"]),
    ("sqlx", &["store", "engine"]),
    ("mysql", &["store", "engine"]),
    ("sqlite", &["store", "engine"]),
    ("redis_front", &["engine"]),
    ("http", &["store", "engine", "redis_front"]),
    ("inbox", &["store", "engine"]),
    ("outbox", &["store", "engine"]),
    ("ops", &["store", "engine"]),
    ("client", &["engine"]),
    ("openapi", &["engine", "http", "store"]),
    ("fuzz", &["engine"]),
    ("guide", &[]),
];

/// The library's source files: `src/bin/` holds binaries, crates of their own that use
/// the library through its public API (their `crate::` is themselves).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.ends_with("src/bin") {
            continue;
        }
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The part a file belongs to: its folder under `src/`, or its own name.
fn part(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_owned()
}

/// The parts (or root items) a line of code names through `crate::`.
fn named(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(list) = rest.strip_prefix('{') {
            // `use crate::{a::x, b};`
            let end = list.find('}').unwrap_or(list.len());
            for item in list[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

#[test]
fn each_part_imports_only_the_parts_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let parts: BTreeSet<&str> = ALLOWED.iter().map(|(part, _)| *part).collect();
    let mut broken = Vec::new();
    for file in &files {
        let from = part(&src, file);
        if from == "lib" {
            continue;
        }
        let allowed = ALLOWED
            .iter()
            .find(|(part, _)| *part == from)
            .unwrap_or_else(|| panic!("{} is in no part of the module map", file.display()))
            .1;
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue; // documentation links are not imports
            }
            for to in named(code) {
                let fine =
                    to == from || to == "self" || to == "super" || allowed.contains(&to.as_str());
                if !fine {
                    let why = if parts.contains(to.as_str()) {
                        format!("{from} may not import {to}")
                    } else {
                        format!("`crate::{to}` is a crate-root name: import it from its module")
                    };
                    broken.push(format!("{}:{}: {why}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "import rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_part_of_the_map_exists() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    for (part, _) in ALLOWED {
        assert!(
            src.join(part).is_dir() || src.join(format!("{part}.rs")).is_file(),
            "the module map names {part}, which src/ does not have"
        );
    }
}
