#!/usr/bin/env bash
# The e2e scenarios with kube-proxy's IPVS mode (`netpol-e2e run --service-proxy ipvs`),
# inside a Debian-kernel VM (issue 21: this machine's kernel has no IPVS).
#
#   bash scripts/ipvs-e2e.sh [--kernel 5.10|6.1|6.12] [--userspace bullseye|bookworm|trixie]
#                          [--service-proxy ipvs|iptables|nftables] [--cells CELL,...]
#                          [--all|--quick] [--only PATH]... [-- EXTRA...]
#
# Builds nothing: runs target/release/netpol-e2e and netpol-agent as the host built them
# (`cargo build --release --locked --bins` first; NPA_E2E_BIN_DIR=DIR takes both from DIR). One VM (scripts/vm.sh, TCG, 2 vCPUs,
# 4 GiB) runs the cells one after another; the exit status is non-zero when any failed.
#
# CELL is CNI/FAMILY: calico/ipv4, calico/dual, bridge/ipv4, bridge/dual (default: all four).
# Scenarios: by default a subset chosen by value (see IPVS_SUBSET below: ingress isolation of
# a same-node backend, egress rules naming pods by selector or namespace, ports and named
# ports, UDP and SCTP, ClusterNetworkPolicy tiers, updates); every one probes through
# ClusterIPs, with clients and backends on the same node and on different nodes. `--all`:
# every scenario (e2e/scenarios e2e/regressions); `--only PATH` (repeatable): those instead. EXTRA is passed to `netpol-e2e run`
# (e.g. --check-explain). FELIX_KUBEIPVSSUPPORTENABLED=false in the environment reaches the
# agents and `compile` (the "before": rules without IPVS support).
# `--userspace` runs the guest with that Debian release's iptables, ipset, iproute2 and
# ipvsadm (scripts/vm.sh); `--service-proxy` other than ipvs runs the same scenarios with
# kube-proxy's other modes, so the e2e scenarios run on another kernel and userspace than
# this machine's (docs/verified-on.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proj="$(cd "$here/.." && pwd)"
cd "$proj"
# A fresh machine: ipvsadm and the rest for the host-userspace guest (it sees this file system).
source scripts/setup.sh

kernel=6.1
userspace=()
proxy=ipvs
cells="calico/ipv4,calico/dual,bridge/ipv4,bridge/dual"
all=0
quick=0
only=()
extra=(--converge-timeout-secs 180 --probe-timeout-ms 2000)
while [ $# -gt 0 ]; do
	case "$1" in
	--kernel) kernel="$2"; shift 2 ;;
	--userspace) userspace=(--userspace "$2"); shift 2 ;;
	--service-proxy) proxy="$2"; shift 2 ;;
	--cells) cells="$2"; shift 2 ;;
	--all) all=1; shift ;;
	--quick) quick=1; shift ;;
	--only) only+=("$2"); shift 2 ;;
	--) shift; extra+=("$@"); break ;;
	*) echo "usage: bash scripts/ipvs-e2e.sh [--kernel K] [--userspace R] [--service-proxy P] [--cells CNI/FAMILY,...] [--all|--quick] [--only PATH]... [-- EXTRA...]" >&2; exit 2 ;;
	esac
done

IPVS_SUBSET=(
	e2e/scenarios/netpol/should-support-a-default-deny-ingress-policy.yaml
	e2e/scenarios/netpol/should-deny-egress-from-pods-based-on-podselector.yaml
	e2e/scenarios/netpol/should-enforce-policy-to-allow-traffic-from-pods-within-server-namespace-based-on-podselector.yaml
	e2e/scenarios/netpol/should-enforce-egress-policy-allowing-traffic-to-a-server-in-a-different-namespace-based-on-podselector-and-namespaceselector.yaml
	e2e/scenarios/netpol/should-allow-egress-access-on-one-named-port.yaml
	e2e/scenarios/netpol/should-enforce-policy-based-on-ports.yaml
	e2e/scenarios/netpol/should-enforce-updated-policy.yaml
	e2e/scenarios/netpol/should-allow-egress-access-to-server-in-cidr-block.yaml
	e2e/scenarios/netpol-udp/should-support-a-default-deny-ingress-policy.yaml
	e2e/scenarios/netpol-sctp/should-enforce-policy-based-on-ports.yaml
	e2e/scenarios/cnp/cnp-admin-tier-ingress-tcp.yaml
	e2e/scenarios/cnp/cnp-baseline-tier-egress-tcp.yaml
)
# --quick (the test command's cell): six of them, one per defect class IPVS support fixes or
# could break: a same-node backend's ingress isolation, egress rules naming pods by selector,
# named ports, port lists, UDP, and a ClusterNetworkPolicy tier.
IPVS_QUICK=(
	e2e/scenarios/netpol/should-support-a-default-deny-ingress-policy.yaml
	e2e/scenarios/netpol/should-deny-egress-from-pods-based-on-podselector.yaml
	e2e/scenarios/netpol/should-allow-egress-access-on-one-named-port.yaml
	e2e/scenarios/netpol/should-enforce-policy-based-on-ports.yaml
	e2e/scenarios/netpol-udp/should-support-a-default-deny-ingress-policy.yaml
	e2e/scenarios/cnp/cnp-admin-tier-ingress-tcp.yaml
)
if [ ${#only[@]} -gt 0 ]; then
	scenarios=("${only[@]}")
elif [ "$quick" = 1 ]; then
	scenarios=("${IPVS_QUICK[@]}")
elif [ "$all" = 1 ]; then
	scenarios=(e2e/scenarios e2e/regressions)
else
	scenarios=("${IPVS_SUBSET[@]}")
fi
bindir="${NPA_E2E_BIN_DIR:-target/release}"
for bin in netpol-e2e netpol-agent; do
	[ -x "$bindir/$bin" ] || { echo "ipvs-e2e: $bindir/$bin missing: cargo build --release --locked --bins" >&2; exit 2; }
done

# The guest's script: br_netfilter for the bridge cells (a node with a bridge CNI has it),
# IPVS loaded as kube-proxy loads it, then every cell; a cell's failure does not stop the rest.
guest="$(mktemp /tmp/ipvs-e2e.XXXXXX.sh)"
trap 'rm -f "$guest"' EXIT
{
	echo 'modprobe -a br_netfilter ip_vs ip_vs_rr dummy || true'
	echo 'status=0'
	IFS=, read -ra list <<<"$cells"
	for cell in "${list[@]}"; do
		cni="${cell%/*}" fam="${cell#*/}"
		printf 'echo "=== ipvs-e2e: kernel %s cell %s/%s"; start=$(date +%%s)\n' "$kernel" "$cni" "$fam"
		printf '%q run --cni %q --ip-family %q --service-proxy %q' "$bindir/netpol-e2e" "$cni" "$fam" "$proxy"
		[ ${#extra[@]} -gt 0 ] && printf ' %q' "${extra[@]}"
		printf ' %q' "${scenarios[@]}"
		printf ' || status=1\n'
		printf 'echo "=== ipvs-e2e: cell %s/%s took $(( $(date +%%s) - start )) s"\n' "$cni" "$fam"
	done
	echo 'exit $status'
} >"$guest"
# The guest's limit: an hour, or 200 s per scenario and cell when that is more (under TCG a
# scenario takes 180-650 s, two at a time; two cells of 12 outlasted an hour).
nscen=0
for sc in "${scenarios[@]}"; do
	if [ -d "$sc" ]; then nscen=$((nscen + $(find "$sc" -name '*.yaml' | wc -l))); else nscen=$((nscen + 1)); fi
done
IFS=, read -ra ncells <<<"$cells"
vm_timeout=$((nscen * ${#ncells[@]} * 200 + 600))
[ "$vm_timeout" -ge 3600 ] || vm_timeout=3600
exec bash "$here/vm.sh" --kernel "$kernel" "${userspace[@]}" --cpus 2 --mem 4096 --timeout "$vm_timeout" -- bash "$guest"
