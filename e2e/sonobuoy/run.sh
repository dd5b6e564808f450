#!/usr/bin/env bash
# Runs Kubernetes' own NetworkPolicy conformance tests (through sonobuoy) against
# netpol-agent on a real cluster whose CNI does not enforce policy itself. See README.md
# beside this file for the prerequisites. On the clusters this repository builds, the same
# runs are `bash scripts/k8s-conformance.sh --suite netpol --sonobuoy`.
#
#   e2e/sonobuoy/run.sh                       # deploy/ as shipped (interfaces: auto)
#   NETPOL_OVERLAY=deploy/overlays/flannel NETPOL_AGENT_IMAGE=registry.example/netpol-agent:dev e2e/sonobuoy/run.sh
#
# Settings (environment):
#   NETPOL_OVERLAY, NETPOL_AGENT_IMAGE, FELIX_*   how the agent is installed (e2e/lib/agent.sh)
#   FOCI                    space-separated e2e focus expressions, one sonobuoy run each
#                           (default: '\[Feature:NetworkPolicy\]' and 'Netpol')
#   E2E_SKIP                skip expression (default: '\[Disruptive\]|\[Flaky\]'; add
#                           '|\[Feature:SCTPConnectivity\]' where the nodes have no SCTP)
#   SONOBUOY_ARGS           more arguments for `sonobuoy run` (e.g. --skip-preflight on a
#                           cluster without DNS, --image-pull-policy IfNotPresent)
#   WAIT_MINUTES            per sonobuoy run (default 180)
#   OUT_DIR                 where results go (default ./sonobuoy-results-<time>)
#   KEEP_AGENT=1            leave netpol-agent installed afterwards (default: remove it and
#                           its rules from every node)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
skip="${E2E_SKIP:-\[Disruptive\]|\[Flaky\]}"
wait_minutes="${WAIT_MINUTES:-180}"
read -r -a sonobuoy_args <<<"${SONOBUOY_ARGS:-}"
out="${OUT_DIR:-$PWD/sonobuoy-results-$(date +%Y%m%d-%H%M%S)}"
if [[ -n "${FOCI:-}" ]]; then
    read -r -a foci <<<"$FOCI"
else
    foci=('\[Feature:NetworkPolicy\]' 'Netpol')
fi
ns=kube-system
ds=netpol-agent

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---- preflight
for tool in kubectl sonobuoy; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done
kubectl version >/dev/null || die "kubectl cannot reach the cluster (KUBECONFIG?)"
mkdir -p "$out"
log "results go to $out"

# Other NetworkPolicy enforcers would make the results say nothing about netpol-agent.
enforcers=$(kubectl get daemonsets -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' |
    grep -E '/(calico-node|cilium|antrea-agent|kube-network-policies|kube-router|weave-net|canal)$' || true)
if [[ -n "$enforcers" ]]; then
    log "warning: these DaemonSets may enforce NetworkPolicy themselves; make sure their policy enforcement is off:"
    printf '  %s\n' $enforcers >&2
fi
if kubectl -n kube-system get daemonset aws-node -o yaml 2>/dev/null | grep -q 'aws-eks-nodeagent'; then
    log "warning: the VPC CNI's network policy agent container is present; make sure it is disabled"
fi

# ---- cleanup, also on failure
source "$repo/e2e/lib/agent.sh"

finish() {
    local status=$?
    log "deleting sonobuoy's namespace and cluster objects"
    sonobuoy delete --all --wait >/dev/null 2>&1 || true
    if [[ "${KEEP_AGENT:-0}" != 1 ]]; then
        log "removing netpol-agent"
        cleanup_nodes
    fi
    exit "$status"
}
trap finish EXIT

# ---- deploy netpol-agent
deploy_agent

# ---- the conformance runs
summary="$out/summary.txt"
: >"$summary"
run=0
for focus in "${foci[@]}"; do
    run=$((run + 1))
    log "sonobuoy run $run: focus $focus"
    sonobuoy delete --all --wait >/dev/null 2>&1 || true
    sonobuoy run --plugin e2e --e2e-focus="$focus" --e2e-skip="$skip" --wait="$wait_minutes" \
        ${sonobuoy_args[@]+"${sonobuoy_args[@]}"}
    sonobuoy status || true
    tarball=$(sonobuoy retrieve "$out")
    mv "$tarball" "$out/run-$run.tar.gz"
    tarball="$out/run-$run.tar.gz"
    {
        echo "== run $run: --e2e-focus='$focus' --e2e-skip='$skip'"
        sonobuoy results "$tarball"
        echo "-- failed tests:"
        sonobuoy results "$tarball" --plugin e2e --mode detailed |
            grep '"status":"failed"' | sed -E 's/.*"name":"([^"]*)".*/  \1/' || echo "  none"
        echo
    } | tee -a "$summary"
done

# ---- what the agents saw
kubectl -n "$ns" logs -l app.kubernetes.io/name=netpol-agent --tail=-1 --prefix >"$out/agent.log" 2>&1 || true
for p in $(kubectl -n "$ns" get pods -l app.kubernetes.io/name=netpol-agent -o name); do
    # The metrics port is on the node (host network); ask it through the API server proxy.
    kubectl get --raw "/api/v1/namespaces/$ns/pods/${p#pod/}:9091/proxy/metrics" \
        >"$out/metrics-${p#pod/}.txt" 2>/dev/null || true
done
grep -h -E '^netpol_(rejections_total|dataplane_apply_failures_total|programming_latency_seconds_(count|sum))' \
    "$out"/metrics-*.txt 2>/dev/null | tee -a "$summary" || true

log "summary: $summary"
