#!/usr/bin/env bash
# The demo: the example shop (examples/demo) as pods in network namespaces on two simulated
# nodes, the real netpol-agent enforcing on each, the reachability table before and after
# the example policies, then everything removed. Nothing outside the namespaces it makes is
# touched (also on failure or Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

cargo build --release --locked --quiet --bins
exec target/release/netpol-e2e demo --cluster examples/demo/cluster.yaml --policies examples/demo/policies.yaml
