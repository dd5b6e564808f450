#!/usr/bin/env bash
# The agent's own failure modes against a real API server (issue 36), on the cluster of
# scripts/k8s-cluster.sh (up with the agent installed). Each check uses real pods and real
# packets (agnhost connect from a client pod) and says passed or FAILED with what it saw:
#
#   1. kube-apiserver restarted with etcd compacted meanwhile: the agents' watches resume
#      from a resource version etcd no longer has (410 Gone) and relist; a default-deny holds
#      throughout (probes while the API server is down), and a policy change after it is
#      enforced.
#   2. the ClusterNetworkPolicy and staged CRDs installed after the agents started: a
#      ClusterNetworkPolicy created then is enforced (the agent looks for a missing resource
#      every 30 s).
#   3. the agent's RBAC reduced (networkpolicies taken from its ClusterRole): every agent
#      not ready with the reason, the rules kept (the default-deny still holds), ready again
#      once the ClusterRole is restored.
#
#   bash scripts/k8s-faults.sh           # ends with `N passed, M failed`
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${NETPOL_K8S_CLUSTER:-$ROOT/target/k8s/cluster}
[ -f "$STATE/admin.kubeconfig" ] || { echo "k8s-faults: no cluster is up" >&2; exit 2; }
eval "$(bash scripts/k8s.sh paths)"
K=("$K8S_BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig")
NS=npk-faults
passed=0 failed=0
say() { echo "=== k8s-faults: $*"; }
ok() { echo "passed  $*"; passed=$((passed + 1)); }
bad() { echo "FAILED  $*"; failed=$((failed + 1)); }

# One TCP connect from the client pod to the server pod (0: connected).
probe() { "${K[@]}" -n "$NS" exec client -- /agnhost connect --timeout=1s --protocol=tcp "$SERVER_IP:80" >/dev/null 2>&1; }
# The readiness answer of the agent on NODE (its health server listens on the node's
# loopback), and `status body`.
readiness() { ip netns exec "$1" curl -s -m 3 -w ' %{http_code}' http://127.0.0.1:9099/readiness || true; }
agent_nodes() { "${K[@]}" -n kube-system get pods -l app.kubernetes.io/name=netpol-agent -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}'; }
wait_until() { # SECONDS CMD...: 0 when CMD succeeded within SECONDS
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 1
  done
}
denied() { ! probe; }

cleanup() {
  "${K[@]}" delete ns "$NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "${K[@]}" delete clusternetworkpolicy npk-faults-deny --ignore-not-found >/dev/null 2>&1 || true
}
trap cleanup EXIT

say "pods: a server and a client on different nodes"
"${K[@]}" create ns "$NS" >/dev/null
"${K[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: $NS, labels: {app: server}}
spec:
  nodeSelector: {kubernetes.io/hostname: npk-w1}
  containers:
  - {name: s, image: "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION", args: [serve-hostname, --tcp, --http=false, --port, "80"]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: $NS, labels: {app: client}}
spec:
  nodeSelector: {kubernetes.io/hostname: npk-w2}
  containers:
  - {name: c, image: "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION", args: [pause]}
EOF
"${K[@]}" -n "$NS" wait --for=condition=Ready pod/server pod/client --timeout=120s >/dev/null
SERVER_IP=$("${K[@]}" -n "$NS" get pod server -o jsonpath='{.status.podIP}')
wait_until 30 probe || { bad "baseline: the client cannot reach the server without any policy"; exit 1; }
"${K[@]}" apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: $NS}
spec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress]}
EOF
wait_until 30 denied || { bad "baseline: the default-deny was not enforced within 30 s"; exit 1; }

# --- 1. API server restart, etcd compacted --------------------------------------------------
say "1. kube-apiserver stopped, etcd compacted, kube-apiserver started again"
bash scripts/k8s-cluster.sh stop npk-cp kube-apiserver
etcdctl=("$ETCD_BIN/etcdctl" --endpoints https://127.0.0.1:2379 --cacert "$STATE/pki/ca.crt"
  --cert "$STATE/pki/apiserver-etcd-client.crt" --key "$STATE/pki/apiserver-etcd-client.key")
# Writes the agents never see (a namespace's labels, via etcd's own key space would be
# wrong: instead a change through a second write after the restart) are not needed: the
# compaction alone moves the oldest kept revision past every watch's resource version.
rev=$(ip netns exec npk-cp "${etcdctl[@]}" endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])')
ip netns exec npk-cp "${etcdctl[@]}" compact "$rev" >/dev/null
leaks=0
for _ in $(seq 1 5); do probe && leaks=$((leaks + 1)); sleep 1; done
bash scripts/k8s-cluster.sh restart npk-cp kube-apiserver
wait_until 120 "${K[@]}" get --raw /readyz >/dev/null 2>&1 || { bad "kube-apiserver did not come back"; exit 1; }
for _ in $(seq 1 5); do probe && leaks=$((leaks + 1)); sleep 1; done
if [ "$leaks" -eq 0 ]; then ok "the default-deny held while the API server was down and after (10 probes)"; else bad "$leaks of 10 probes crossed the default-deny around the restart"; fi
# The agents relisted (a 410 or a fresh listing) and follow changes again.
"${K[@]}" apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: $NS}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}]}]
EOF
if wait_until 60 probe; then ok "a policy made after the restart was enforced"; else bad "a policy made after the restart was not enforced within 60 s"; fi
relisted=0
for p in $("${K[@]}" -n kube-system get pods -l app.kubernetes.io/name=netpol-agent -o name); do
  "${K[@]}" -n kube-system logs "$p" | grep -qiE 'resource version expired|relist|410' && relisted=$((relisted + 1))
done
echo "        agents that logged a relist after the compaction: $relisted"
"${K[@]}" -n "$NS" delete networkpolicy allow-client >/dev/null
wait_until 30 denied || bad "the allow's deletion was not enforced"

# --- 2. CRDs installed after the agents --------------------------------------------------
say "2. the ClusterNetworkPolicy and staged CRDs removed, then installed under running agents"
crd=$(go mod download -json "sigs.k8s.io/network-policy-api@v$(awk -F= '/^NPA_VERSION=/ {print $2}' e2e/k8s/versions.env)" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml
"${K[@]}" -n "$NS" delete networkpolicy deny >/dev/null
wait_until 30 probe || bad "the default-deny's deletion was not enforced"
"${K[@]}" delete -f "$crd" --wait >/dev/null
"${K[@]}" delete -f deploy/crds/ --wait >/dev/null
sleep 5
"${K[@]}" apply --server-side -f "$crd" >/dev/null
"${K[@]}" apply -f deploy/crds/ >/dev/null
"${K[@]}" wait --for condition=established crd/clusternetworkpolicies.policy.networking.k8s.io --timeout=60s >/dev/null
"${K[@]}" apply -f - >/dev/null <<EOF
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: npk-faults-deny}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $NS}}, podSelector: {matchLabels: {app: server}}}}
  ingress: [{action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: $NS}}}]}]
EOF
start=$SECONDS
if wait_until 90 denied; then ok "a ClusterNetworkPolicy made after its CRD was installed late was enforced after $((SECONDS - start)) s"; else bad "a ClusterNetworkPolicy made after its CRD was installed late was not enforced within 90 s"; fi
"${K[@]}" delete clusternetworkpolicy npk-faults-deny >/dev/null
wait_until 30 probe || bad "the ClusterNetworkPolicy's deletion was not enforced"

# --- 3. RBAC reduced -------------------------------------------------------------------------
say "3. networkpolicies taken from the agent's ClusterRole"
"${K[@]}" -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: $NS}
spec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress]}
EOF
wait_until 30 denied || bad "the default-deny was not enforced again"
"${K[@]}" get clusterrole netpol-agent -o json >"$STATE/clusterrole.saved.json"
python3 - "$STATE/clusterrole.saved.json" >"$STATE/clusterrole.reduced.json" <<'EOF'
import json, sys
role = json.load(open(sys.argv[1]))
for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
    role["metadata"].pop(key, None)
for rule in role["rules"]:
    rule["resources"] = [r for r in rule.get("resources", []) if r != "networkpolicies"]
role["rules"] = [r for r in role["rules"] if r.get("resources")]
print(json.dumps(role))
EOF
"${K[@]}" replace -f "$STATE/clusterrole.reduced.json" >/dev/null
# The refusal comes when a watch is resumed: make every agent resume now.
bash scripts/k8s-cluster.sh restart npk-cp kube-apiserver
wait_until 120 "${K[@]}" get --raw /readyz >/dev/null 2>&1
not_ready=0
for n in $(agent_nodes); do
  if wait_until 90 sh -c "ip netns exec $n curl -s -m 3 http://127.0.0.1:9099/readiness | grep -q 'refuses this agent'"; then
    not_ready=$((not_ready + 1))
    echo "        $n: $(readiness "$n" | cut -c1-220)"
  fi
done
nodes=$(agent_nodes | wc -l)
if [ "$not_ready" -eq "$nodes" ]; then ok "every agent ($nodes) not ready, naming the refusal"; else bad "$not_ready of $nodes agents said not ready with the refusal"; fi
if denied && denied; then ok "the rules were kept: the default-deny still holds"; else bad "the default-deny stopped holding while RBAC was reduced"; fi
python3 - "$STATE/clusterrole.saved.json" >"$STATE/clusterrole.restored.json" <<'EOF'
import json, sys
role = json.load(open(sys.argv[1]))
for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
    role["metadata"].pop(key, None)
print(json.dumps(role))
EOF
"${K[@]}" replace -f "$STATE/clusterrole.restored.json" >/dev/null
ready=0
for n in $(agent_nodes); do
  if wait_until 120 sh -c "ip netns exec $n curl -s -m 3 -o /dev/null -w '%{http_code}' http://127.0.0.1:9099/readiness | grep -q 200"; then ready=$((ready + 1)); fi
done
if [ "$ready" -eq "$nodes" ]; then ok "every agent ready again once the ClusterRole was restored"; else bad "$ready of $nodes agents ready again within 120 s of the restore"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
