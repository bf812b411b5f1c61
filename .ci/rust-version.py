#!/usr/bin/env python3
"""Checks the crate's declared `rust-version` against what its dependencies need.

For each public feature set (the default one, each feature alone, all of them), lists the
crates a build with those features compiles (normal and build dependencies, on any
platform; dev-dependencies are not followed: a user of the crate never builds them) and
takes the highest `rust-version` they declare in `cargo metadata`. Prints what it found
and fails when that is above what the crate states: its `rust-version`, or for a feature
listed in `[package.metadata.feature-rust-version]`, that feature's entry (which must
then be exactly what the feature's dependencies need).

Usage: .ci/rust-version.py   (from anywhere inside the repository)
"""

import json
import subprocess
import sys

PUBLIC_FEATURES = [
    "postgres",
    "deadpool",
    "bb8",
    "sqlx",
    "mysql",
    "sqlite",
    "redis",
    "encryption",
    "rabbitmq",
    "client",
    "utoipa",
    "gateway",
]


def version_key(text):
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def cargo(*args):
    return subprocess.run(
        ["cargo", *args], check=True, capture_output=True, text=True
    ).stdout


def requirement(args, rust_versions):
    """(highest rust-version, the crates declaring it, how many crates declare none, count).

    The crates are those a build of the crate with `args` compiles, on any platform:
    `cargo tree` resolves features as that build does (a dev-dependency's features do
    not leak in), and `cargo metadata` says what each crate declares.
    """
    tree = cargo(
        "tree", "--locked", "-p", "axum-idempotency", "-e", "normal,build", "--target", "all",
        "--prefix", "none", "--format", "{p}", *args,
    )
    crates = set()
    for line in tree.splitlines():
        name, version = line.split()[:2]
        if name != "axum-idempotency":
            crates.add((name, version.lstrip("v")))
    highest, by, undeclared = None, [], 0
    for crate in sorted(crates):
        declared = rust_versions[crate]
        if declared is None:
            undeclared += 1
        elif highest is None or version_key(declared) > version_key(highest):
            highest, by = declared, [crate[0]]
        elif version_key(declared) == version_key(highest):
            by.append(crate[0])
    return highest, by, undeclared, len(crates)


def main():
    meta = json.loads(cargo("metadata", "--format-version", "1", "--locked", "--all-features"))
    rust_versions = {
        (package["name"], package["version"]): package.get("rust_version")
        for package in meta["packages"]
    }
    root = next(p for p in meta["packages"] if p["id"] == meta["resolve"]["root"])
    own = root["rust_version"]
    # Features whose dependencies need a newer Rust than the crate's own `rust-version`,
    # as the README's requirements state them: `[package.metadata.feature-rust-version]`.
    by_feature = (root.get("metadata") or {}).get("feature-rust-version", {})

    sets = [("default features", [], ["deadpool"])]
    for feature in PUBLIC_FEATURES:
        sets.append((
            f"--no-default-features --features {feature}",
            ["--no-default-features", "--features", feature],
            [feature],
        ))
    sets.append(("all public features", ["--features", ",".join(PUBLIC_FEATURES)], PUBLIC_FEATURES))

    failures = []
    for label, args, features in sets:
        highest, by, undeclared, count = requirement(args, rust_versions)
        stated = max([own] + [by_feature[f] for f in features if f in by_feature], key=version_key)
        names = ", ".join(by[:4]) + (f" and {len(by) - 4} more" if len(by) > 4 else "")
        verdict = "ok"
        if highest is not None and version_key(highest) > version_key(stated):
            verdict = f"ABOVE the stated {stated}"
            failures.append(label)
        print(f"{label:<48} stated {stated:<5} needed {highest:<7} ({names}); "
              f"{count} crates, {undeclared} declaring none: {verdict}")
    # A per-feature requirement must be what that feature's dependencies need, not more.
    for feature, stated in sorted(by_feature.items()):
        highest, _, _, _ = requirement(["--no-default-features", "--features", feature], rust_versions)
        if highest is None or version_key(highest) != version_key(stated):
            print(f"feature {feature}: stated {stated}, its dependencies need {highest}")
            failures.append(f"feature {feature}")
    print(f"declared: rust-version {own}; per feature {by_feature or 'none'}")
    if failures:
        print(
            "the stated minimum Rust is not what the dependencies need (above): fix "
            "rust-version or [package.metadata.feature-rust-version] in Cargo.toml, and the "
            "README's requirements",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
