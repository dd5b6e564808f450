#!/usr/bin/env bash
# The test command: sets up a fresh Debian machine (as root) and runs every check CI runs:
# formatting, clippy, all unit, property, golden and real-kernel (network namespace) tests,
# and the end-to-end scenario suite (e2e/scenarios) on simulated nodes.
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
# One summary line for the cargo tests (cargo prints one per test binary).
read -r unit_passed unit_failed < <(awk '/^test result:/ { p += $4; f += $6 } END { print p+0, f+0 }' target/test-output.txt)
echo "cargo tests: $unit_passed passed, $unit_failed failed"

# The end-to-end suite: every scenario in e2e/scenarios on simulated nodes in network
# namespaces, with the release binaries (what users run).
cargo build --release --locked --bins
set +e
target/release/netpol-e2e run --jobs "${NETPOL_E2E_JOBS:-3}" e2e/scenarios 2>&1 | tee target/e2e-output.txt
e2e_status=${PIPESTATUS[0]}
set -e
read -r e2e_passed e2e_failed < <(awk '/^[0-9]+ passed, [0-9]+ failed$/ { p = $1; f = $3 } END { print p+0, f+0 }' target/e2e-output.txt)
if [ "$e2e_status" -ne 0 ] && [ "$e2e_failed" -eq 0 ]; then e2e_failed=1; fi
echo "e2e scenarios: $e2e_passed passed, $e2e_failed failed"

echo "$((unit_passed + e2e_passed)) passed, $((unit_failed + e2e_failed)) failed"
if [ "$status" -ne 0 ]; then exit "$status"; fi
exit "$e2e_status"
