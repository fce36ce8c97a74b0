#!/usr/bin/env bash
# The test command: installs what the tests need, then checks formatting, lints and runs every test.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/install-test-deps.sh
bash scripts/check-artifacts.sh   # the shipped manifests, dashboards, alerts and image, by the real validators
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --all-targets --locked
