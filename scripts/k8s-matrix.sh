#!/usr/bin/env bash
# The real-cluster matrix (issue 36): for each cell a fresh cluster of scripts/k8s-cluster.sh
# with the agent installed from deploy/, then upstream's [Feature:NetworkPolicy] specs through
# the e2e binary (and, with --sonobuoy, through `sonobuoy run`), network-policy-api's
# ClusterNetworkPolicy conformance suite, and the cluster taken down. Ends with one line per
# cell and suite and `N passed, M failed, K skipped` over everything; the per-spec lists are in
# target/k8s/results/ (docs/verified-on.md has the figures of the last full run).
#
#   bash scripts/k8s-matrix.sh [--cells "bridge/ipv4/iptables routed/dual/nftables ..."]
#        [--k8s VERSION] [--sonobuoy] [--suites "netpol cnp connectivity"]
#
# Suites: netpol (upstream's e2e binary), cnp (network-policy-api's), connectivity (every
# scenario file of e2e/ through `netpol-e2e run --kubeconfig`, scripts/k8s-connectivity.sh).
#
# Default cells: {bridge, routed} x {ipv4, dual} x kube-proxy {iptables, nftables} on this
# kernel. kube-proxy's IPVS mode needs a kernel with IP_VS (this machine's has none), see
# docs/development/real-cluster.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cells="bridge/ipv4/iptables bridge/ipv4/nftables bridge/dual/iptables bridge/dual/nftables routed/ipv4/iptables routed/ipv4/nftables routed/dual/iptables routed/dual/nftables"
k8s_args=()
sonobuoy=0
suites="netpol cnp"
while [ $# -gt 0 ]; do
  case "$1" in
    --cells) cells=$2; shift 2 ;;
    --k8s) k8s_args=(--k8s "$2"); shift 2 ;;
    --sonobuoy) sonobuoy=1; shift ;;
    --suites) suites=$2; shift 2 ;;
    *) echo "k8s-matrix: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p target/k8s
summary=target/k8s/matrix-$(date -u +%Y%m%dT%H%M%SZ).txt
bash scripts/k8s.sh build "${k8s_args[@]}"
total_p=0 total_f=0 total_s=0 status=0
record() { # CELL SUITE LOG
  local line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$3" | tail -1)
  [ -n "$line" ] || line="0 passed, 1 failed, 0 skipped"
  echo "$1 $2: $line $(grep -E '^of the [0-9]+ failed' "$3" | tail -1)" | tee -a "$summary"
  read -r p _ f _ s _ <<<"$(echo "$line" | tr -d ',')"
  total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
}
for cell in $cells; do
  IFS=/ read -r cni family proxy <<<"$cell"
  log=target/k8s/matrix-cell.log
  echo "=== k8s-matrix: cell $cell"
  if ! bash scripts/k8s-cluster.sh up --cni "$cni" --ip-family "$family" --proxy-mode "$proxy" "${k8s_args[@]}" >"$log" 2>&1; then
    tail -20 "$log"
    echo "$cell: the cluster did not come up (log above)" | tee -a "$summary"
    total_f=$((total_f + 1)); status=1
    continue
  fi
  for suite in $suites; do
    out=target/k8s/matrix-$suite.log
    if [ "$suite" = connectivity ]; then
      bash scripts/k8s-connectivity.sh >"$out" 2>&1 || status=1
    else
      bash scripts/k8s-conformance.sh --suite "$suite" >"$out" 2>&1 || status=1
    fi
    record "$cell" "$suite" "$out"
    if [ "$suite" = netpol ] && [ "$sonobuoy" = 1 ]; then
      bash scripts/k8s-conformance.sh --suite netpol --sonobuoy >"$out" 2>&1 || status=1
      record "$cell" "netpol (sonobuoy)" "$out"
    fi
  done
  bash scripts/k8s-cluster.sh down >/dev/null 2>&1 || true
done
echo "summary: $summary"
echo "$total_p passed, $total_f failed, $total_s skipped"
exit $status
