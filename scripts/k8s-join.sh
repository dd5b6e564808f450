#!/usr/bin/env bash
# A node joining the running cluster of scripts/k8s-cluster.sh (issue 37: no fail-open window
# on new nodes), as an autoscaler adds one. Before the node exists, a namespace holds a
# NetworkPolicy isolating the `isolated` pod, and two pods (isolated, open) wait, Pending,
# for that node (nodeSelector kubernetes.io/hostname). Then the node joins, and from the
# moment each pod has an address a prober in another node's network namespace connects to
# both every 100 ms, until both run and the new node's agent has been ready for 10 s.
#
#   bash scripts/k8s-join.sh              # with the startup taint (deploy/components/startup-taint):
#                                         # the node registers with netpol-agent.io/agent-not-ready,
#                                         # its agent removes it once ready
#   bash scripts/k8s-join.sh --no-taint   # the shipped deploy/ alone: measures the window the
#                                         # taint closes (reported, not failed)
#
# Passes when the isolated pod answered no probe and the open pod answered (so the probes
# reached the node), the new node's agent is ready and, with the taint, the taint is gone
# and no pod started on the node before it was. Ends with `N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${NETPOL_K8S_CLUSTER:-$PWD/target/k8s/cluster}
[ -f "$STATE/admin.kubeconfig" ] || { echo "k8s-join: no cluster is up" >&2; exit 1; }
KUBECTL=("$(cat "$STATE/kubectl.path")" --kubeconfig "$STATE/admin.kubeconfig")
k() { "${KUBECTL[@]}" "$@"; }
eval "$(bash scripts/k8s.sh paths)"
TAINT=netpol-agent.io/agent-not-ready
with_taint=1
[ "${1:-}" = --no-taint ] && with_taint=0
passed=0 failed=0
ok() { echo "passed  $*"; passed=$((passed + 1)); }
bad() { echo "FAILED  $*"; failed=$((failed + 1)); }
say() { echo "=== k8s-join: $*"; }
ns=join-$$
work=$(mktemp -d)
prober_pid=
cleanup() {
  [ -n "$prober_pid" ] && kill "$prober_pid" 2>/dev/null || true
  k delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# The agent as the operator installs it for this case: deploy/ with the startup taint's
# component, or deploy/ alone.
if [ "$with_taint" = 1 ]; then
  bash scripts/k8s-agent.sh install --component startup-taint >/dev/null
else
  bash scripts/k8s-agent.sh install >/dev/null
fi
new=npk-w$(wc -l <"$STATE/nodes")
say "the next node is $new (startup taint: $([ "$with_taint" = 1 ] && echo "$TAINT" || echo none))"

image="registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION"
k create namespace "$ns" >/dev/null
k apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: $ns}
spec:
  podSelector: {matchLabels: {role: isolated}}
  policyTypes: [Ingress]
---
apiVersion: v1
kind: Pod
metadata: {name: isolated, namespace: $ns, labels: {role: isolated}}
spec:
  nodeSelector: {kubernetes.io/hostname: $new}
  containers:
  - {name: s, image: "$image", imagePullPolicy: IfNotPresent, args: [netexec, --http-port, "8080"]}
---
apiVersion: v1
kind: Pod
metadata: {name: open, namespace: $ns, labels: {role: open}}
spec:
  nodeSelector: {kubernetes.io/hostname: $new}
  containers:
  - {name: s, image: "$image", imagePullPolicy: IfNotPresent, args: [netexec, --http-port, "8080"]}
EOF

# The prober: in npk-w1's network namespace (another node: its traffic to the new node's
# pods is routed there and meets their ingress policy), learning the pods' addresses from a
# watch, connecting every 100 ms from the moment an address is known.
cat >"$work/prober.py" <<'EOF'
import atexit, json, os, socket, subprocess, sys, threading, time
kubectl, ns, out, agent_ready = sys.argv[1:5]
ips, running, first_ok, last_ok = {}, {}, {}, {}
def watch():
    p = subprocess.Popen(kubectl.split() + ["-n", ns, "get", "pods", "-w", "-o", "json", "--output-watch-events"],
                         stdout=subprocess.PIPE, text=True)
    atexit.register(p.terminate)
    # One event a line ({"type":...,"object":{...}}), as kubectl prints a JSON watch.
    for line in p.stdout:
        try:
            pod = json.loads(line)["object"]
        except (ValueError, KeyError):
            continue
        name = pod["metadata"]["name"]
        status = pod.get("status", {})
        if status.get("podIP") and name not in ips:
            ips[name] = (status["podIP"], time.time())
        if status.get("phase") == "Running" and name not in running:
            running[name] = time.time()
threading.Thread(target=watch, daemon=True).start()
counts = {}
done_at = None
while True:
    now = time.time()
    for name, (ip, _) in list(ips.items()):
        s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
        s.settimeout(0.25)
        try:
            s.connect((ip, 8080))
            answered = True
        except OSError:
            answered = False
        finally:
            s.close()
        c = counts.setdefault(name, [0, 0])
        c[0] += 1
        c[1] += answered
        if answered:
            first_ok.setdefault(name, now)
            last_ok[name] = now
    if done_at is None and len(running) == 2 and os.path.exists(agent_ready):
        done_at = now + 10
    if done_at is not None and now >= done_at:
        break
    time.sleep(0.1)
with open(out + ".tmp", "w") as f:
    json.dump({"counts": counts, "ips": ips, "running": running, "first_answer": first_ok,
               "last_answer": last_ok, "agent_ready": os.path.getmtime(agent_ready)}, f)
os.replace(out + ".tmp", out)
EOF
ip netns exec npk-w1 python3 "$work/prober.py" "${KUBECTL[*]}" "$ns" "$work/probes.json" "$work/agent-ready" &
prober_pid=$!

join_args=()
[ "$with_taint" = 1 ] && join_args=(--taint "$TAINT=:NoSchedule")
t0=$(date +%s.%N)
bash scripts/k8s-cluster.sh join "${join_args[@]}" >"$work/join.log" 2>&1 \
  || { tail -20 "$work/join.log"; bad "join $new"; echo "$passed passed, $failed failed"; exit 1; }
t_ready=$(date +%s.%N)
say "$new joined and Ready after $(python3 -c "print(round($t_ready - $t0, 1))") s"

# The taint goes once the node's agent is ready.
if [ "$with_taint" = 1 ]; then
  gone=
  for _ in $(seq 1 240); do
    if ! k get node "$new" -o jsonpath='{.spec.taints[*].key}' | grep -qw "$TAINT"; then gone=$(date +%s.%N); break; fi
    sleep 0.5
  done
  if [ -n "$gone" ]; then
    ok "the startup taint was removed $(python3 -c "print(round($gone - $t_ready, 1))") s after $new was Ready"
  else
    k -n kube-system logs -l app.kubernetes.io/name=netpol-agent --tail 20 --prefix | grep -i taint | tail -5 || true
    bad "the startup taint is still on $new after 120 s"
  fi
fi
if k -n "$ns" wait --for=condition=Ready pod/isolated pod/open --timeout 180s >/dev/null 2>&1; then
  ok "both pods running on $new"
else
  k -n "$ns" get pods -o wide; bad "the pods did not start on $new"
fi
agent=$(k -n kube-system get pods -l app.kubernetes.io/name=netpol-agent --field-selector spec.nodeName="$new" -o name)
if [ -n "$agent" ] && k -n kube-system wait --for=condition=Ready "$agent" --timeout 120s >/dev/null 2>&1; then
  ok "the agent on $new is ready ($agent)"
else
  bad "no ready agent on $new"
fi
touch "$work/agent-ready"
wait "$prober_pid" || true
prober_pid=

python3 - "$work/probes.json" "$with_taint" >"$work/verdict" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["counts"]
iso, opn = c.get("isolated", [0, 0]), c.get("open", [0, 0])
print(f"isolated {iso[1]} {iso[0]}")
print(f"open {opn[1]} {opn[0]}")
# The window: from the isolated pod's first answer to its last, and its last answer against
# the moment the script saw the node's agent ready (a pod's readiness, seen by polling).
f, l = r["first_answer"].get("isolated"), r["last_answer"].get("isolated")
if f is not None:
    print(f"window {l - f:.1f} {r['agent_ready'] - l:.1f}")
else:
    print("window none none")
EOF
read -r _ iso_ok iso_n < <(sed -n 1p "$work/verdict")
read -r _ open_ok open_n < <(sed -n 2p "$work/verdict")
read -r _ window_s before_ready_s < <(sed -n 3p "$work/verdict")
say "probes from npk-w1 every 100 ms: isolated answered $iso_ok of $iso_n, open $open_ok of $open_n"
if [ "$with_taint" = 1 ]; then
  if [ "$open_ok" -gt 0 ] && [ "$iso_ok" = 0 ]; then
    ok "no fail-open window: the isolated pod answered 0 of $iso_n probes, the open pod $open_ok of $open_n"
  else
    # What the new node's agent did meanwhile (its starts, auto's wiring, its first applies),
    # for whoever reads a failure from CI's output alone.
    [ -n "$agent" ] && k -n kube-system logs "$agent" --all-containers 2>/dev/null \
      | grep -E 'starting|auto|restarting|first full apply|ready' | cut -c1-300 | sed 's/^/  agent: /' || true
    bad "the isolated pod answered $iso_ok of $iso_n probes over $window_s s (its last answer $before_ready_s s before its agent was seen ready), the open pod $open_ok of $open_n"
  fi
else
  # The shipped deploy/ alone: what the window is on this cluster, for the record.
  if [ "$open_ok" -gt 0 ] && [ "$iso_ok" = 0 ]; then
    ok "without the startup taint (the before): the isolated pod answered 0 of $iso_n probes (its agent won the race this time), the open pod $open_ok of $open_n"
  elif [ "$open_ok" -gt 0 ]; then
    ok "without the startup taint (the before): the isolated pod answered $iso_ok of $iso_n probes over $window_s s (its last answer $before_ready_s s before its agent was seen ready), the open pod $open_ok of $open_n"
  else
    bad "without the startup taint: the open pod never answered ($open_n probes): the probes prove nothing"
  fi
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
