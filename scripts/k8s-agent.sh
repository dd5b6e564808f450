#!/usr/bin/env bash
# The agent on the cluster of scripts/k8s-cluster.sh, installed the way docs/install.md tells
# an operator to (issue 36): the CRDs, `kubectl apply -k` of deploy/ or an overlay, the image
# scripts/k8s-images.sh built (already in every node's containerd), a rollout that completes
# on every node, the control-plane node included.
#
#   bash scripts/k8s-agent.sh install [--overlay NAME] [--component NAME]...
#        (a component of deploy/components/ added as docs/install.md shows: a kustomization
#        of the operator's own naming deploy/ or the overlay, and the components)
#   bash scripts/k8s-agent.sh check          # every node's agent ready, no RBAC refusal logged
#   bash scripts/k8s-agent.sh uninstall      # docs/operations/uninstall.md's steps
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${NETPOL_K8S_CLUSTER:-$PWD/target/k8s/cluster}
[ -f "$STATE/admin.kubeconfig" ] || { echo "k8s-agent: no cluster is up" >&2; exit 1; }
KUBECTL=("$(cat "$STATE/kubectl.path")" --kubeconfig "$STATE/admin.kubeconfig")
# shellcheck source=../e2e/k8s/versions.env
source e2e/k8s/versions.env

say() { echo "=== k8s-agent: $*"; }
die() { echo "k8s-agent: $*" >&2; exit 1; }

npa_crd() {
  local dir
  dir=$(go mod download -json "sigs.k8s.io/network-policy-api@v$NPA_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  echo "$dir/config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml"
}

# Why each agent pod that is not ready is not: its Ready condition, restarts and last exit,
# kubelet's probe events, and the agent's own words (its warnings and errors, the readiness
# answers it logged, and the previous container's last lines after a restart).
not_ready_report() {
  local p node
  # Every agent pod, in case a node has two (the DaemonSet counts the oldest).
  "${KUBECTL[@]}" -n kube-system get pods -l app.kubernetes.io/name=netpol-agent -o wide --no-headers >&2 || true
  for p in $("${KUBECTL[@]}" -n kube-system get pods -l app.kubernetes.io/name=netpol-agent \
      -o jsonpath='{range .items[*]}{.metadata.name}:{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' \
      | awk -F: '$2 != "True" { print $1 }'); do
    echo "--- $p: not ready" >&2
    "${KUBECTL[@]}" -n kube-system get pod "$p" -o jsonpath='node {.spec.nodeName}; Ready {.status.conditions[?(@.type=="Ready")].status} since {.status.conditions[?(@.type=="Ready")].lastTransitionTime} ({.status.conditions[?(@.type=="Ready")].reason}); restarts {.status.containerStatuses[0].restartCount}; last exit {.status.containerStatuses[0].lastState.terminated.reason} {.status.containerStatuses[0].lastState.terminated.exitCode}{"\n"}' >&2 || true
    # A node whose own Ready condition fails has its pods marked not ready by the node
    # lifecycle controller, whatever their probes say.
    node=$("${KUBECTL[@]}" -n kube-system get pod "$p" -o jsonpath='{.spec.nodeName}' 2>/dev/null) || node=
    [ -z "$node" ] || "${KUBECTL[@]}" get node "$node" -o jsonpath='node {.metadata.name}: Ready {.status.conditions[?(@.type=="Ready")].status} since {.status.conditions[?(@.type=="Ready")].lastTransitionTime} ({.status.conditions[?(@.type=="Ready")].message}){"\n"}' >&2 || true
    "${KUBECTL[@]}" -n kube-system get events --field-selector "involvedObject.name=$p" >&2 || true
    "${KUBECTL[@]}" -n kube-system logs "$p" 2>&1 | grep -E '"level":"(WARN|ERROR)"|"probe":' | tail -15 >&2 || true
    "${KUBECTL[@]}" -n kube-system logs --previous "$p" 2>/dev/null | tail -10 >&2 || true
  done
}

check() {
  local nodes want ready pods waited=0
  nodes=$("${KUBECTL[@]}" get nodes --no-headers | wc -l)
  want=$("${KUBECTL[@]}" -n kube-system get ds netpol-agent -o jsonpath='{.status.desiredNumberScheduled}')
  [ "$want" = "$nodes" ] || die "the DaemonSet wants $want pods for $nodes nodes"
  # A completed rollout had every pod ready; one that is not a moment later lost readiness
  # after having it, which a user's `kubectl get ds` shows too. Say why, and give it the
  # time of three readiness probes to come back (a restarted container, a node's status
  # late under load) before calling the install broken.
  while :; do
    ready=$("${KUBECTL[@]}" -n kube-system get ds netpol-agent -o jsonpath='{.status.numberReady}')
    [ "$ready" = "$nodes" ] && break
    if [ "$waited" = 0 ]; then
      echo "k8s-agent: $ready of $nodes agents ready after the rollout; why:" >&2
      not_ready_report
    fi
    [ "$waited" -ge 30 ] && die "$ready of $nodes agents ready ($waited s after the rollout; why above)"
    sleep 2; waited=$((waited + 2))
  done
  [ "$waited" = 0 ] || echo "k8s-agent: note: every agent ready again $waited s after the rollout (see above why one was not)" >&2
  # An RBAC refusal in an agent's log (the API server's words for a 403: `<resource> is
  # forbidden: User "system:serviceaccount:..." cannot <verb> ...`): the shipped RBAC is not
  # enough for something it reads. Not any "forbidden": 1.33's refusal of streaming lists
  # (422, "sendInitialEvents is forbidden ...", answered with paginated lists) is none.
  pods=$("${KUBECTL[@]}" -n kube-system get pods -l app.kubernetes.io/name=netpol-agent -o name)
  rbac='is forbidden: User|cannot (get|list|watch|patch) resource'
  for p in $pods; do
    if "${KUBECTL[@]}" -n kube-system logs "$p" | grep -qE "$rbac"; then
      "${KUBECTL[@]}" -n kube-system logs "$p" | grep -E "$rbac" | head -5 >&2
      die "$p was refused by the API server (RBAC)"
    fi
  done
  say "$ready of $nodes agents ready, none refused by RBAC"
}

case "${1:-}" in
  install)
    shift
    target=deploy/
    components=()
    while [ $# -gt 0 ]; do
      case "$1" in
        --overlay) target=deploy/overlays/$2/; shift 2 ;;
        --component)
          [ -f "deploy/components/$2/kustomization.yaml" ] || die "no component deploy/components/$2"
          components+=("$2"); shift 2 ;;
        *) die "unknown option $1" ;;
      esac
    done
    if [ ${#components[@]} -gt 0 ]; then
      # The operator's own kustomization, beside the repository's (paths relative to it).
      own=target/k8s/install-kustomization
      rm -rf "$own" && mkdir -p "$own"
      {
        echo "apiVersion: kustomize.config.k8s.io/v1beta1"
        echo "kind: Kustomization"
        echo "resources: [../../../$target]"
        echo "components:"
        for c in "${components[@]}"; do echo "  - ../../../deploy/components/$c"; done
      } >"$own/kustomization.yaml"
      target=$own/
    fi
    say "CRDs: network-policy-api v$NPA_VERSION (ClusterNetworkPolicy), deploy/crds/ (staged kinds)"
    "${KUBECTL[@]}" apply --server-side -f "$(npa_crd)" >/dev/null
    "${KUBECTL[@]}" apply -f deploy/crds/ >/dev/null
    say "kubectl apply -k $target"
    "${KUBECTL[@]}" apply -k "$target" >/dev/null
    "${KUBECTL[@]}" -n kube-system rollout status ds/netpol-agent --timeout 300s \
      || { "${KUBECTL[@]}" -n kube-system get pods -o wide >&2; die "the rollout did not complete"; }
    check
    ;;
  check)
    check
    ;;
  uninstall)
    say "kubectl delete -k deploy/, then the uninstall DaemonSet"
    "${KUBECTL[@]}" delete -k deploy/ --ignore-not-found >/dev/null
    # What deploy/components/ adds (the startup taint's RBAC), whether installed or not.
    "${KUBECTL[@]}" delete clusterrolebinding,clusterrole netpol-agent-startup-taint --ignore-not-found >/dev/null
    "${KUBECTL[@]}" apply -k deploy/uninstall/ >/dev/null
    "${KUBECTL[@]}" -n kube-system rollout status ds/netpol-agent-uninstall --timeout 300s
    "${KUBECTL[@]}" delete -k deploy/uninstall/ --ignore-not-found >/dev/null
    ;;
  *)
    die "usage: install [--overlay NAME] [--component NAME]... | check | uninstall"
    ;;
esac
