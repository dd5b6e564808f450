#!/usr/bin/env bash
# Runs kubernetes-sigs/network-policy-api's ClusterNetworkPolicy conformance suite (go test,
# conformance profile ClusterNetworkPolicy) against netpol-agent on a real cluster. See
# README.md beside this file. On the clusters this repository builds, the same run is
# `bash scripts/k8s-conformance.sh --suite cnp`.
#
#   e2e/network-policy-api/run.sh             # deploy/ as shipped (interfaces: auto)
#   NETPOL_OVERLAY=deploy/overlays/flannel NETPOL_AGENT_IMAGE=registry.example/netpol-agent:dev e2e/network-policy-api/run.sh
#
# Settings (environment), see README.md for all of them:
#   NETPOL_OVERLAY, NETPOL_AGENT_IMAGE, FELIX_*   how the agent is installed (e2e/lib/agent.sh)
#   NPA_VERSION          network-policy-api tag for the CRD and the suite (default v0.2.0)
#   CRD_CHANNEL          standard (default) | experimental
#   SUPPORTED_FEATURES   default ClusterNetworkPolicy,ClusterNetworkPolicyNamedPorts
#   NPA_SRC              existing checkout at NPA_VERSION instead of a clone
#   GO_TEST_TIMEOUT      default 60m
#   REPORT_VERSION / REPORT_CONTACT / REPORT_URL / REPORT_ADDITIONAL_INFO
#   DEBUG=1              pass --debug to the suite
#   OUT_DIR              default ./network-policy-api-results-<time>
#   KEEP_AGENT=1         leave netpol-agent installed
#   KEEP_CRD=1           leave the CRD installed when this run installed it
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
npa_version="${NPA_VERSION:-v0.2.0}"
channel="${CRD_CHANNEL:-standard}"
features="${SUPPORTED_FEATURES:-ClusterNetworkPolicy,ClusterNetworkPolicyNamedPorts}"
go_timeout="${GO_TEST_TIMEOUT:-60m}"
report_version="${REPORT_VERSION:-${NETPOL_AGENT_IMAGE:+${NETPOL_AGENT_IMAGE##*:}}}"
report_version="${report_version:-v$(awk -F'"' '/^version *=/ { print $2; exit }' "$repo/Cargo.toml")}"
report_contact="${REPORT_CONTACT:-@netpol-agent-maintainers}"
report_url="${REPORT_URL:-https://example.invalid/netpol-agent}"
report_info="${REPORT_ADDITIONAL_INFO:-e2e/network-policy-api/run.sh (manual run)}"
out="${OUT_DIR:-$PWD/network-policy-api-results-$(date +%Y%m%d-%H%M%S)}"
ns=kube-system
ds=netpol-agent
sa="system:serviceaccount:$ns:netpol-agent"
crd=clusternetworkpolicies.policy.networking.k8s.io
crd_url="https://raw.githubusercontent.com/kubernetes-sigs/network-policy-api/refs/tags/$npa_version/config/crd/$channel/policy.networking.k8s.io_clusternetworkpolicies.yaml"
conformance_namespaces=(network-policy-conformance-gryffindor network-policy-conformance-slytherin
    network-policy-conformance-hufflepuff network-policy-conformance-ravenclaw
    network-policy-conformance-forbidden-forrest)

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

case "$channel" in standard | experimental) ;; *) die "CRD_CHANNEL must be standard or experimental, not $channel" ;; esac

# ---- preflight
for tool in kubectl git go; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done
kubectl version >/dev/null || die "kubectl cannot reach the cluster (KUBECONFIG?)"
mkdir -p "$out"
log "results go to $out"

enforcers=$(kubectl get daemonsets -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' |
    grep -E '/(calico-node|cilium|antrea-agent|kube-network-policies|kube-router|weave-net|canal|kube-ovn-cni|ovnkube-node)$' || true)
if [[ -n "$enforcers" ]]; then
    log "warning: these DaemonSets may enforce (Cluster)NetworkPolicy themselves; make sure their policy enforcement is off:"
    printf '  %s\n' $enforcers >&2
fi
for n in "${conformance_namespaces[@]}"; do
    if kubectl get namespace "$n" >/dev/null 2>&1; then
        die "namespace $n exists already (a previous run?); delete it first"
    fi
done

# ---- cleanup, also on failure
crd_installed_here=0
source "$repo/e2e/lib/agent.sh"

finish() {
    local status=$?
    # The suite deletes what it created unless it was killed; make sure.
    for n in "${conformance_namespaces[@]}"; do
        kubectl delete namespace "$n" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    done
    # Its ClusterNetworkPolicies are cluster-scoped and named generically ("default"); name
    # them rather than delete what may be someone else's.
    leftover=$(kubectl get "$crd" -o name 2>/dev/null || true)
    [[ -n "$leftover" ]] && log "ClusterNetworkPolicies left in the cluster (remove the suite's by hand if a run was killed): $(tr '\n' ' ' <<<"$leftover")"
    if [[ "${KEEP_AGENT:-0}" != 1 ]]; then
        log "removing netpol-agent"
        cleanup_nodes
    fi
    if [[ "$crd_installed_here" == 1 && "${KEEP_CRD:-0}" != 1 ]]; then
        log "removing the CRD this run installed"
        kubectl delete crd "$crd" --ignore-not-found || true
    fi
    exit "$status"
}
trap finish EXIT

# ---- the CRD, from the release
if existing=$(kubectl get crd "$crd" -o jsonpath='{.metadata.annotations.policy\.networking\.k8s\.io/bundle-version} {.metadata.annotations.policy\.networking\.k8s\.io/channel}' 2>/dev/null); then
    log "the CRD is installed already ($existing); applying $npa_version $channel over it"
    if [[ "$existing" != "$npa_version $channel" ]]; then
        log "warning: the installed CRD was $existing; it is replaced by $npa_version $channel and not restored afterwards"
    fi
else
    crd_installed_here=1
fi
log "installing $crd_url"
kubectl apply -f "$crd_url"
kubectl wait --for=condition=Established "crd/$crd" --timeout=2m

# ---- deploy netpol-agent
deploy_agent
for verb in get list watch; do
    kubectl auth can-i "$verb" "$crd" --as="$sa" >/dev/null ||
        die "the agent's service account cannot $verb $crd: deploy/ lacks the RBAC rule (is ClusterNetworkPolicy support merged?)"
done

# ---- the suite
if [[ -n "${NPA_SRC:-}" ]]; then
    src="$NPA_SRC"
    [[ -f "$src/conformance/conformance_profile_test.go" ]] || die "NPA_SRC=$src is not a network-policy-api checkout"
    log "using $src ($(git -C "$src" describe --tags --always 2>/dev/null || echo unknown revision))"
else
    src="$out/network-policy-api"
    log "cloning network-policy-api $npa_version"
    git clone --quiet --depth 1 --branch "$npa_version" https://github.com/kubernetes-sigs/network-policy-api.git "$src"
fi
git -C "$src" rev-parse HEAD >"$out/network-policy-api-commit.txt" 2>/dev/null || true

debug_flag=()
[[ "${DEBUG:-0}" == 1 ]] && debug_flag=(--debug)
report="$out/conformance-report.yaml"
log "go test ./conformance (profile ClusterNetworkPolicy, features $features, timeout $go_timeout)"
set +e
(
    cd "$src"
    go test -v ./conformance -run '^TestConformanceProfiles$' -timeout "$go_timeout" -args \
        --conformance-profiles=ClusterNetworkPolicy \
        --supported-features="$features" \
        --cleanup-base-resources=true \
        --organization="netpol-agent" --project="netpol-agent" --url="$report_url" \
        --version="$report_version" --contact="$report_contact" \
        --additional-info="$report_info" \
        --report-output="$report" "${debug_flag[@]}"
) 2>&1 | tee "$out/go-test.log"
go_status=${PIPESTATUS[0]}
set -e

# ---- what the agents saw
kubectl -n "$ns" logs -l app.kubernetes.io/name=netpol-agent --tail=-1 --prefix >"$out/agent.log" 2>&1 || true
for p in $(kubectl -n "$ns" get pods -l app.kubernetes.io/name=netpol-agent -o name); do
    # The metrics port is on the node (host network); ask it through the API server proxy.
    kubectl get --raw "/api/v1/namespaces/$ns/pods/${p#pod/}:9091/proxy/metrics" \
        >"$out/metrics-${p#pod/}.txt" 2>/dev/null || true
done

summary="$out/summary.txt"
{
    echo "== network-policy-api $npa_version ($(cat "$out/network-policy-api-commit.txt" 2>/dev/null)), CRD channel $channel"
    echo "== supported features: $features; go test exit status $go_status"
    if [[ -f "$report" ]]; then
        grep -E '^\s*(name|result|summary|Passed|Failed|Skipped):|^\s*- CNP|Features:' "$report" || true
    else
        echo "no report was written (the suite stopped before the end; see go-test.log)"
    fi
    echo "-- failed tests and subtests:"
    grep -E -- '--- FAIL' "$out/go-test.log" || echo "  none"
    grep -h -E '^netpol_(rejections_total|dataplane_apply_failures_total|programming_latency_seconds_(count|sum))' \
        "$out"/metrics-*.txt 2>/dev/null || true
} | tee "$summary"
log "summary: $summary"
exit "$go_status"
