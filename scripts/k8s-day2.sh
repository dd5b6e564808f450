#!/usr/bin/env bash
# Day two on the cluster of scripts/k8s-cluster.sh (issue 37), as docs/install.md,
# docs/operations/upgrade.md, flow-logs.md and uninstall.md tell an operator to do it:
#   1. install with an overlay (`kubectl apply -k deploy/overlays/NAME/`): rollout complete;
#   2. upgrade: a new image tag in deploy/image/, the same overlay applied again: the
#      DaemonSet runs the new tag and keeps every setting of the overlay;
#   3. flow-log files with the shipped DaemonSet's volumes: two pods talk, the record reaches
#      /var/log/netpol-agent/flowlogs/flows.log on the host (the DaemonSet's hostPath);
#   4. uninstall: no chain, rule or set of ours left on any node, either iptables backend.
# Ends with `N passed, M failed`.
#
#   bash scripts/k8s-day2.sh [--overlay NAME]   (default flannel: the bridge CNI's wiring;
#                                                 `auto` for deploy/ itself)
set -euo pipefail
cd "$(dirname "$0")/.."
overlay=flannel
[ "${1:-}" = --overlay ] && overlay=$2
STATE=${NETPOL_K8S_CLUSTER:-$PWD/target/k8s/cluster}
[ -f "$STATE/admin.kubeconfig" ] || { echo "k8s-day2: no cluster is up" >&2; exit 1; }
KUBECTL=("$(cat "$STATE/kubectl.path")" --kubeconfig "$STATE/admin.kubeconfig")
k() { "${KUBECTL[@]}" "$@"; }
eval "$(bash scripts/k8s.sh paths)"
passed=0 failed=0
ok() { echo "passed  $*"; passed=$((passed + 1)); }
bad() { echo "FAILED  $*"; failed=$((failed + 1)); }
say() { echo "=== k8s-day2: $*"; }
work=$(mktemp -d)
flows=/var/log/netpol-agent/flowlogs/flows.log
ns=day2-$$
# The nodes share this machine's file system: the flow-log files written here are removed
# again, unless the directory was there before.
had_flows_dir=0
[ -d "$(dirname "$flows")" ] && had_flows_dir=1
cleanup() {
  k delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  [ "$had_flows_dir" = 1 ] || rm -rf "$(dirname "$flows")"
  rm -rf "$work"
}
trap cleanup EXIT
env_of() { # the agent container's env as NAME=VALUE lines, sorted
  k -n kube-system get ds netpol-agent -o json | python3 -c '
import json, sys
ds = json.load(sys.stdin)
c = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "netpol-agent"][0]
for e in sorted(c.get("env", []), key=lambda e: e["name"]):
    print(e["name"] + "=" + json.dumps(e.get("value", e.get("valueFrom"))))'
}
dir() { if [ "$1" = auto ]; then echo "$2"; else echo "$2/overlays/$1/"; fi; }

# 1. install
say "install: kubectl apply -k $(dir "$overlay" deploy)"
install_args=()
[ "$overlay" = auto ] || install_args=(--overlay "$overlay")
if bash scripts/k8s-agent.sh install "${install_args[@]}" >"$work/install.log" 2>&1; then
  ok "install with $overlay: the rollout completed on every node, every agent ready"
else
  tail -5 "$work/install.log"; bad "install with $overlay"
fi
before=$(env_of)

# 2. upgrade: the release's image under a new tag in every node's containerd, deploy/ copied
# with that tag set in deploy/image/ (what an operator edits), the same overlay applied.
old=$(awk '/newTag:/ { print $2 }' deploy/image/kustomization.yaml)
name=$(awk '/newName:/ { print $2 }' deploy/image/kustomization.yaml)
new=$old-day2
for sock in /run/npk/*/containerd.sock; do
  "$CONTAINERD_BIN/ctr" --address "$sock" -n k8s.io images tag --force "$name:$old" "$name:$new" >/dev/null
done
cp -r deploy "$work/deploy"
sed -i "s/newTag: .*/newTag: $new/" "$work/deploy/image/kustomization.yaml"
say "upgrade: $name:$old -> $new, kubectl apply -k $(dir "$overlay" deploy) again"
k apply -k "$(dir "$overlay" "$work/deploy")" >/dev/null
if k -n kube-system rollout status ds/netpol-agent --timeout 300s >/dev/null \
  && bash scripts/k8s-agent.sh check >/dev/null; then
  image=$(k -n kube-system get ds netpol-agent -o jsonpath='{.spec.template.spec.containers[0].image}')
  after=$(env_of)
  if [ "$image" = "$name:$new" ] && [ "$after" = "$before" ]; then
    ok "upgrade with the overlay: runs $image, the overlay's $(echo "$after" | wc -l) settings kept"
  else
    diff <(echo "$before") <(echo "$after") || true
    bad "upgrade: image $image, settings $( [ "$after" = "$before" ] && echo kept || echo changed)"
  fi
else
  bad "upgrade: the rollout did not complete"
fi

# 3. flow-log files: on, flushed every 2 s; a client's connections to a server are recorded.
say "flow logs to files: FELIX_FLOWLOGSENABLED, FELIX_FLOWLOGSFILEENABLED"
k -n kube-system set env ds/netpol-agent FELIX_FLOWLOGSENABLED=true FELIX_FLOWLOGSFILEENABLED=true \
  FELIX_FLOWLOGSFLUSHINTERVAL=2 >/dev/null
k -n kube-system rollout status ds/netpol-agent --timeout 300s >/dev/null
k create namespace "$ns" >/dev/null
k -n "$ns" run server --image "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION" \
  --image-pull-policy IfNotPresent --port 8080 -- netexec --http-port 8080 >/dev/null
k -n "$ns" run client --image "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION" \
  --image-pull-policy IfNotPresent >/dev/null
k -n "$ns" wait pod --all --for=condition=Ready --timeout 120s >/dev/null
server=$(k -n "$ns" get pod server -o jsonpath='{.status.podIP}')
found=""
for _ in $(seq 30); do
  k -n "$ns" exec client -- /agnhost connect "$server:8080" --timeout 2s >/dev/null 2>&1 || true
  if grep -qsF "$server" "$flows"; then found=yes; break; fi
  sleep 2
done
if [ -n "$found" ]; then
  ok "flow-log file: $server's flow in $flows ($(wc -l <"$flows") records)"
else
  ls -la "$(dirname "$flows")" 2>&1 | head -5
  k -n kube-system logs -l app.kubernetes.io/name=netpol-agent --tail=200 | grep -i 'flow' | tail -5
  bad "flow-log file: no record of $server in $flows"
fi
k delete namespace "$ns" --wait=false >/dev/null

# 4. uninstall, then every node clean (the nodes are network namespaces of this machine).
say "uninstall (docs/operations/uninstall.md)"
if bash scripts/k8s-agent.sh uninstall >"$work/uninstall.log" 2>&1; then
  left=""
  for node in $(k get nodes -o name | sed 's|node/||'); do
    for tool in iptables-nft-save iptables-legacy-save ip6tables-nft-save ip6tables-legacy-save; do
      n=$(ip netns exec "$node" "$tool" 2>/dev/null | grep -c -- '-j cali-\|^:cali-' || true)
      [ "$n" -eq 0 ] || left="$left $node/$tool:$n"
    done
    n=$(ip netns exec "$node" ipset list -n 2>/dev/null | grep -c '^cali' || true)
    [ "$n" -eq 0 ] || left="$left $node/ipset:$n"
  done
  if [ -z "$left" ]; then ok "uninstall: no chain, rule or set of ours on any node"; else bad "uninstall left:$left"; fi
else
  tail -5 "$work/uninstall.log"; bad "uninstall"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
