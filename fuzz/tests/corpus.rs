//! Replays every committed fuzz corpus (`fuzz/corpus/<target>/`) through the property
//! checks the fuzz targets run, on stable Rust and without a fuzzing engine:
//! `RUSTFLAGS="--cfg fuzzing" cargo test --manifest-path fuzz/Cargo.toml`. Without
//! `--cfg fuzzing` the checks do not exist and this file is empty.
#![cfg(fuzzing)]

use std::path::{Path, PathBuf};

use axum_idempotency::__fuzz::TARGETS;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_input_passes_its_target_s_checks() {
    let mut failures = Vec::new();
    for (target, check) in TARGETS {
        let inputs = files(&corpus(target));
        assert!(!inputs.is_empty(), "fuzz/corpus/{target}/ is empty");
        for path in inputs {
            let data = std::fs::read(&path).expect("a readable corpus file");
            if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                failures.push(format!("{}: {message}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_target_has_a_corpus_and_a_fuzz_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (target, _) in TARGETS {
        assert!(corpus(target).is_dir(), "no fuzz/corpus/{target}/");
        let source = root.join("fuzz_targets").join(format!("{target}.rs"));
        assert!(source.is_file(), "no {}", source.display());
    }
}
