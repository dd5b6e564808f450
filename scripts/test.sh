#!/usr/bin/env bash
# The test command: sets up a fresh Debian machine (as root) and runs every check CI runs:
# formatting, clippy, and all unit, property, golden and real-kernel (network namespace) tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
mkdir -p target
set +e
cargo test --locked --lib --bins --tests --no-fail-fast 2>&1 | tee target/test-output.txt
status=${PIPESTATUS[0]}
set -e
# One summary line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' target/test-output.txt
exit "$status"
