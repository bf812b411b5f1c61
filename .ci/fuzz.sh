#!/usr/bin/env bash
# Runs every fuzz target under fuzz/ with libFuzzer for a bounded time, on stable Rust: the
# targets are built with the coverage instrumentation cargo-fuzz uses (`-Cpasses=sancov-module`
# and its options are stable codegen flags; no sanitizer, so no nightly), then each runs
# from its committed corpus for SECONDS (default 20). New inputs go to a scratch directory;
# a crash leaves its input in target/fuzz/artifacts/<target>/ and fails the run.
#
# Usage: .ci/fuzz.sh [SECONDS]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-20}"
host="$(rustc -vV | sed -n 's/^host: //p')"
target_dir="$PWD/target/fuzz"
flags=(
    --cfg fuzzing
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    -Cdebug-assertions
    -Coverflow-checks
)
targets=(key fingerprint headers body message_id)

# `--target` keeps the flags off build scripts and proc macros, as cargo-fuzz does.
RUSTFLAGS="${flags[*]}" cargo build --release --manifest-path fuzz/Cargo.toml \
    --target "$host" --target-dir "$target_dir" --bins

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
summary=()
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target" "$target_dir/artifacts/$target"
    log="$scratch/$target.log"
    if ! "$target_dir/$host/release/$target" "$scratch/$target" "fuzz/corpus/$target" \
        -max_total_time="$seconds" -print_final_stats=1 \
        -artifact_prefix="$target_dir/artifacts/$target/" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "fuzz target $target failed; its input is in $target_dir/artifacts/$target/" >&2
        exit 1
    fi
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
    coverage="$(grep -Eo 'cov: [0-9]+' "$log" | tail -n 1)"
    added="$(find "$scratch/$target" -type f | wc -l)"
    summary+=("$(printf '%-12s %10s executions in %ss (%s/s), %s, %s new inputs' \
        "$target" "$runs" "$seconds" "$((runs / seconds))" "$coverage" "$added")")
done
printf '%s\n' "${summary[@]}"
