#!/usr/bin/env bash
# The connectivity test (`netpol-e2e run --kubeconfig`, issue 38) on the cluster of
# scripts/k8s-cluster.sh, as an operator runs it (docs/operations/connectivity-test.md).
#
#   bash scripts/k8s-connectivity.sh                # every scenario of e2e/scenarios and e2e/regressions
#   bash scripts/k8s-connectivity.sh --smoke        # a handful, then what the runner must refuse and survive
#   bash scripts/k8s-connectivity.sh [--jobs N] [--check-explain|--check-flow-logs] [PATH...]
#
# --smoke turns the agents' flow logs on and runs its scenarios with --check-flow-logs (the
# agents' explain --kernel on each node must answer every probe and agree, their flow records
# hold every probe as explain says), then (each must pass, read from `--output json`):
#   refusal    a kubeconfig of a ServiceAccount with no rights: the run refuses, names what it
#              lacks, creates nothing;
#   interrupt  SIGINT while a scenario's pods start: the run ends and leaves no namespace of
#              its run behind;
#   no-enforcement  the agent uninstalled, one isolating scenario: the run says in words that
#              nothing enforces, and stops (the agent is not put back: the smoke is the
#              cluster's last user).
# Ends with `N passed, M failed, K skipped`. Results: target/k8s/results/connectivity*.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${NETPOL_K8S_CLUSTER:-$PWD/target/k8s/cluster}
[ -f "$STATE/admin.kubeconfig" ] || { echo "k8s-connectivity: no cluster is up" >&2; exit 1; }
KC=$STATE/admin.kubeconfig
KUBECTL=("$(cat "$STATE/kubectl.path")" --kubeconfig "$KC")
OUT=target/k8s/results
mkdir -p "$OUT"

say() { echo "=== k8s-connectivity: $*"; }
die() { echo "k8s-connectivity: $*" >&2; exit 2; }

smoke=0
jobs=4
explain=()
paths=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --check-explain) explain=(--check-explain); shift ;;
    # The agents must run with FELIX_FLOWLOGSENABLED=true (kubectl set env); implies the above.
    --check-flow-logs) explain=(--check-flow-logs); shift ;;
    -*) die "unknown option $1" ;;
    *) paths+=("$1"); shift ;;
  esac
done

# The runner: the release build when one is there (the test command made it), else built.
E2E=target/release/netpol-e2e
if [ ! -x "$E2E" ] || [ -n "$(find e2e/src -newer "$E2E" -name '*.rs' -print -quit)" ]; then
  say "building netpol-e2e"
  cargo build --release --locked -q -p netpol-e2e
fi
# The agnhost the cluster's nodes hold (no registry here): scripts/k8s.sh paths names it.
eval "$(bash scripts/k8s.sh paths | grep '^AGNHOST_VERSION=')"
IMAGE=registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION
cell=$(tr ' ' '\n' <"$STATE/cell" | awk -F= '$1 == "cni" || $1 == "ip-family" || $1 == "proxy-mode" { printf "%s%s", sep, $2; sep = "-" }')

passed=0 failed=0 skipped=0
result() { # passed|failed TEXT
  echo "$1  $2"
  if [ "$1" = passed ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
# Namespaces a run left: none may carry the run label once it has ended.
leftovers() { "${KUBECTL[@]}" get ns -l netpol-e2e.io/run -o name 2>/dev/null | wc -l; }

if [ "$smoke" = 0 ]; then
  [ ${#paths[@]} -gt 0 ] || paths=(e2e/scenarios e2e/regressions)
  say "${paths[*]} on $cell, $jobs execs at a time"
  json=$OUT/connectivity-$cell.json
  set +e
  "$E2E" run --kubeconfig "$KC" --image "$IMAGE" --jobs "$jobs" "${explain[@]}" --output json "${paths[@]}" >"$json" 2> >(tee "$OUT/connectivity-$cell.txt" >&2)
  status=$?
  set -e
  read -r passed failed skipped < <(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print(s["passed"], s["failed"], s["skipped"])' "$json" 2>/dev/null || echo "0 1 0")
  # The enforcement times over the run (the JSON's summary; the text summary went to stdout).
  python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["summary"]["enforcement_ms"]; print("enforcement over the run: p50 %s ms, p99 %s ms (%s steps)" % (e["p50"], e["p99"], e["samples"]))' "$json" 2>/dev/null || true
  [ "$status" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1
  [ "$(leftovers)" = 0 ] || { echo "k8s-connectivity: namespaces left behind"; failed=$((failed + 1)); }
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" = 0 ]
  exit
fi

# --- smoke ---------------------------------------------------------------------------------
# One scenario per thing the runner does, the quick ones (20-40 s each here): ingress and
# egress isolation through Services, UDP, a named port, an ipBlock with a pod's real address,
# namespace relabelling, a ClusterNetworkPolicy over a NetworkPolicy (narrowed to the run's
# namespaces).
smoke_scenarios=(
  e2e/scenarios/netpol/should-support-a-default-deny-ingress-policy.yaml
  e2e/scenarios/legacy/should-enforce-egress-policy-allowing-traffic-to-a-server-in-a-different-namespace-based-on-podselector-and-namespaceselector.yaml
  e2e/scenarios/netpol-udp/should-enforce-policy-based-on-ports.yaml
  e2e/scenarios/legacy/should-allow-ingress-access-on-one-named-port.yaml
  e2e/scenarios/legacy/should-enforce-except-clause-while-egress-access-to-server-in-cidr-block.yaml
  e2e/scenarios/legacy/should-allow-ingress-access-from-updated-namespace.yaml
  e2e/scenarios/cnp/interplay/admin-deny-overrides-networkpolicy-allow.yaml
)
for f in "${smoke_scenarios[@]}"; do [ -f "$f" ] || die "smoke scenario $f is missing"; done
# Flow logs on, as an operator turns them on, for --check-flow-logs.
say "flow logs on: FELIX_FLOWLOGSENABLED=true on the agents"
"${KUBECTL[@]}" -n kube-system set env ds/netpol-agent FELIX_FLOWLOGSENABLED=true >/dev/null
"${KUBECTL[@]}" -n kube-system rollout status ds/netpol-agent --timeout 300s >/dev/null \
  || die "the agents did not roll out with flow logs on"
# With flow logs on each agent turns conntrack accounting on in its node's network namespace,
# through the node's netfilter sysctls the DaemonSet mounts (a container's /proc/sys is
# read-only); without it every record counts 0 packets. The agents share the node's namespace
# (hostNetwork), so their own /proc shows the node's value.
acct_off=()
for p in $("${KUBECTL[@]}" -n kube-system get pods -l app.kubernetes.io/name=netpol-agent -o name); do
  v=$("${KUBECTL[@]}" -n kube-system exec "$p" -- cat /proc/sys/net/netfilter/nf_conntrack_acct 2>&1) || true
  [ "$v" = 1 ] || acct_off+=("$p: $v")
done
[ ${#acct_off[@]} = 0 ] && result passed "conntrack accounting on at every agent's node (flow-log packet and byte counts)" \
  || result failed "conntrack accounting off: ${acct_off[*]}"
say "smoke: ${#smoke_scenarios[@]} scenarios on $cell"
json=$OUT/connectivity-smoke.json
set +e
"$E2E" run --kubeconfig "$KC" --image "$IMAGE" --jobs "$jobs" --check-flow-logs --output json "${smoke_scenarios[@]}" >"$json" 2>"$OUT/connectivity-smoke.txt"
status=$?
set -e
while read -r line; do
  case "$line" in
    passed*) passed=$((passed + 1)); echo "$line" ;;
    failed*) failed=$((failed + 1)); echo "$line" ;;
    *) echo "$line" ;;
  esac
done < <(python3 - "$json" <<'EOF' 2>&1 || echo "failed  the smoke's JSON report could not be read"
import json, sys
doc = json.load(open(sys.argv[1]))
for sc in doc["scenarios"]:
    steps = sc["steps"]
    # --check-flow-logs: the agents' explain answered for every probe of every step and agreed,
    # and their flow records held every probe (a direction or two each) with that verdict.
    ok = sc["result"] == "passed" and steps and all(
        st["passed"] and st["probes"] > 0 and (st.get("explain") or {}).get("probes") == st["probes"]
        and not st["explain"]["disagreements"]
        and (st.get("flow_logs") or {}).get("matched", 0) + st["flow_logs"].get("rode", 0) >= st["probes"]
        and not st["flow_logs"]["problems"] for st in steps)
    timed = [st["enforcement_ms"] for st in steps if st["enforcement_ms"] is not None]
    print(("passed" if ok else "failed") + f"  {sc['name']}: {len(steps)} steps, "
          f"{sum(st['probes'] for st in steps)} probes, each explained by the agents and their "
          f"kernels and in their flow records ({sum(st['flow_logs']['matched'] for st in steps if st.get('flow_logs'))} "
          f"directions), enforcement ms {timed}")
e = doc["summary"]["enforcement_ms"]
print(f"enforcement over the smoke: p50 {e['p50']} ms, p99 {e['p99']} ms ({e['samples']} steps)")
EOF
)
[ "$status" = 0 ] || { tail -30 "$OUT/connectivity-smoke.txt"; result failed "the smoke run exited $status"; }
[ "$(leftovers)" = 0 ] && result passed "no namespace of the run is left" || result failed "namespaces left behind"

# refusal: a user that may do nothing.
say "refusal: a ServiceAccount without rights"
"${KUBECTL[@]}" -n default create serviceaccount netpol-e2e-nobody >/dev/null 2>&1 || true
token=$("${KUBECTL[@]}" -n default create token netpol-e2e-nobody --duration 10m)
nobody=$OUT/nobody.kubeconfig
server=$("${KUBECTL[@]}" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
ca=$("${KUBECTL[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
if [ -z "$ca" ]; then
  ca=$(base64 -w0 <"$("${KUBECTL[@]}" config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')")
fi
cat >"$nobody" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: nobody, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: nobody}}]
current-context: c
EOF
before=$("${KUBECTL[@]}" get ns --no-headers | wc -l)
set +e
refusal=$("$E2E" run --kubeconfig "$nobody" --image "$IMAGE" "${smoke_scenarios[0]}" 2>&1)
rstatus=$?
set -e
after=$("${KUBECTL[@]}" get ns --no-headers | wc -l)
"${KUBECTL[@]}" -n default delete serviceaccount netpol-e2e-nobody >/dev/null 2>&1 || true
rm -f "$nobody"
if [ "$rstatus" = 2 ] && grep -q "refusing to run" <<<"$refusal" && grep -q "create namespaces" <<<"$refusal" && [ "$before" = "$after" ]; then
  result passed "refusal: exit 2, names what it lacks ($(grep -o 'may not [^.]*' <<<"$refusal" | cut -c1-80)...), nothing created"
else
  echo "$refusal" | tail -5
  result failed "refusal: exit $rstatus, namespaces $before -> $after"
fi

# interrupt: SIGINT while the pods of a scenario start.
say "interrupt: SIGINT during a scenario"
"$E2E" run --kubeconfig "$KC" --image "$IMAGE" "${smoke_scenarios[6]}" >"$OUT/connectivity-interrupt.txt" 2>&1 &
pid=$!
# The preflight namespace comes and goes first; then the scenario's own (two or more).
for _ in $(seq 1 200); do
  [ "$(leftovers)" -ge 2 ] && break
  sleep 0.3
done
sleep 2
made=$(leftovers)
kill -INT "$pid"
set +e
wait "$pid"
istatus=$?
set -e
if [ "$made" -gt 0 ] && [ "$istatus" != 0 ] && [ "$(leftovers)" = 0 ] && grep -q "interrupted" "$OUT/connectivity-interrupt.txt"; then
  result passed "interrupt: $made namespaces made, exit $istatus, none left"
else
  tail -5 "$OUT/connectivity-interrupt.txt"
  result failed "interrupt: $made namespaces made before SIGINT, exit $istatus, $(leftovers) left"
fi

# no enforcement: the agent gone, an isolating scenario.
say "no enforcement: the agent uninstalled"
bash scripts/k8s-agent.sh uninstall >"$OUT/connectivity-uninstall.txt" 2>&1 || { tail -5 "$OUT/connectivity-uninstall.txt"; die "uninstalling the agent failed"; }
set +e
"$E2E" run --kubeconfig "$KC" --image "$IMAGE" --converge-timeout-secs 5 \
  "${smoke_scenarios[0]}" "${smoke_scenarios[2]}" >"$OUT/connectivity-none.txt" 2>&1
nstatus=$?
set -e
if [ "$nstatus" = 1 ] && grep -q "^no NetworkPolicy enforcement" "$OUT/connectivity-none.txt" \
  && [ "$(grep -c '^\(PASS\|FAIL\|SKIP\|ERROR\) ' "$OUT/connectivity-none.txt")" = 1 ]; then
  result passed "no enforcement: said in words after the first isolating step, the run stopped there"
else
  tail -8 "$OUT/connectivity-none.txt"
  result failed "no enforcement: exit $nstatus"
fi
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" = 0 ]
