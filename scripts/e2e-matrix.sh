#!/usr/bin/env bash
# The whole end-to-end matrix: every scenario (e2e/scenarios, e2e/regressions) on every cell
# of CNI topology × IP family × kube-proxy mode (4 × 3 × 2 = 24 cells; about an hour on
# 2 cores). Sets up the machine like the test command; ends with `N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --locked --bins
passed=0
failed=0
status=0
for cni in calico sandbox hybridnet bridge; do
  for family in ipv4 ipv6 dual; do
    for proxy in iptables nftables; do
      log="target/e2e-matrix-$cni-$family-$proxy.txt"
      start=$(date +%s)
      set +e
      target/release/netpol-e2e run --cni "$cni" --ip-family "$family" --service-proxy "$proxy" \
        --jobs "${NETPOL_E2E_JOBS:-3}" e2e/scenarios e2e/regressions > "$log" 2>&1
      one=$?
      set -e
      read -r p f < <(awk '/^[0-9]+ passed, [0-9]+ failed$/ { p = $1; f = $3 } END { print p+0, f+0 }' "$log")
      if [ "$one" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
      if [ "$one" -ne 0 ]; then status=$one; fi
      echo "$cni / $family / $proxy: $p passed, $f failed ($(( $(date +%s) - start )) s; log $log)"
      passed=$((passed + p))
      failed=$((failed + f))
    done
  done
done
echo "$passed passed, $failed failed"
exit "$status"
