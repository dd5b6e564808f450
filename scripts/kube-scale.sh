#!/usr/bin/env bash
# The scale bench on a real API server (issue 40, item 1), in one command: etcd and
# kube-apiserver built from sources (scripts/k8s.sh), kwok for fake nodes and pod status, the
# synthetic cluster of benches/support/synthetic.rs loaded through client-go, then agents (the
# real binary, real dataplane, each in a network namespace of its own) measured by
# benches/kube_real.rs: start-up, RSS, CPU at rest and under churn, and what they cost the
# API server (CPU, RSS, bytes sent to each agent, watch events).
#
#   nice -n 19 bash scripts/kube-scale.sh [--smoke|--small|--medium] [--nodes N --pods P
#       --namespaces NS --policies K] [--agents 1,4,8] [--rest S] [--churn R]
#       [--churn-seconds S] [--probes K] [--no-watch-list] [--workers W] [--keep]
#
# Defaults: --agents 0,1,8,32 (--medium 0,1,8,24; --small 0,1,4,8), --rest 60 (--small 30),
# no churn.
#
# --no-watch-list starts kube-apiserver with its WatchList feature gate off (beta, on by
# default since 1.34): it then refuses streaming lists and the agents fall back to paginated
# lists, as they do on such a server; the before/after of issue 40, item 2.
#
# --smoke is the test command's (scripts/test.sh, about 90 s): --small's cluster, one agent,
# 5 s at rest, 10 s of churn at 10 starts a second, 10 probes, the bench built in the dev
# profile (the test command's library, not a third build of it), and its --check: the run
# fails unless the agent applied and kept running, every probe was enforced and every churn
# write succeeded.
#
# Sizes: default 5000 nodes, 150000 pods, 5000 namespaces, 10000 NetworkPolicies (the issue's);
# --medium 500 / 15000 / 500 / 1000; --small (the smoke) 50 / 1500 / 50 / 100. Node node-0
# holds 110 pods (the agent measured in full), the others share the rest. --agents: the agent
# counts measured one round each (all of a round start together; 0 is the API server alone,
# the baseline the agents' costs are read against). --churn R: after the rest
# window, R churn starts a second for --churn-seconds (scale-load churn: pod lives and policy
# edits). Event → enforced is probed for agent-0 in every round with agents (--probes K at
# rest, default 30, and one a second under churn; benches/support/enforced.rs); --probes 0
# turns it off. --keep leaves the work directory (logs, certificates) in place; without it a
# failed run prints the end of each component's log before removing it.
#
# The agents authenticate as the shipped manifests make them: the ServiceAccount, ClusterRole
# and ClusterRoleBinding of deploy/base are applied, and each agent gets a token of that
# ServiceAccount (TokenRequest), so every request they make passes RBAC as in a cluster.
#
# Guarantees: nothing of the host's network is touched. etcd, kube-apiserver, kwok and the
# loader run in a network namespace of their own (nks-<pid>, its bridge br0 10.99.0.1/16, all
# on loopback or that bridge); the agents' namespaces are joined to that bridge by veths made
# inside them. Every process started here is tracked by pid and killed by pid at exit, also on
# failure or Ctrl-C, with the namespaces and the work directory (/tmp/kube-scale.*); the
# agents are benches/kube_real.rs's children, and its namespaces (npa-test-<its pid>-*) are
# swept here if it was killed before it could remove them itself.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=../e2e/k8s/versions.env
source e2e/k8s/versions.env
# shellcheck source=lib/pki.sh
source scripts/lib/pki.sh

say() { echo "=== kube-scale: $*"; }
die() { echo "kube-scale: $*" >&2; exit 1; }

nodes=5000 pods=150000 namespaces=5000 policies=10000 agents=0,1,8,32 rest=60
churn=0 churn_seconds=60 probes=30 workers=64 keep=0 smoke=0 gates=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) nodes=50 pods=1500 namespaces=50 policies=100 agents=1 rest=5 churn=10 churn_seconds=10 probes=10 smoke=1; shift ;;
    --small) nodes=50 pods=1500 namespaces=50 policies=100 agents=0,1,4,8 rest=30; shift ;;
    --medium) nodes=500 pods=15000 namespaces=500 policies=1000 agents=0,1,8,24; shift ;;
    --nodes) nodes=$2; shift 2 ;;
    --pods) pods=$2; shift 2 ;;
    --namespaces) namespaces=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --agents) agents=$2; shift 2 ;;
    --rest) rest=$2; shift 2 ;;
    --churn) churn=$2; shift 2 ;;
    --churn-seconds) churn_seconds=$2; shift 2 ;;
    --probes) probes=$2; shift 2 ;;
    --no-watch-list) gates=(--feature-gates WatchList=false); shift ;;
    --workers) workers=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) die "unknown option $1 (see the header of scripts/kube-scale.sh)" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, the agents' dataplane)"
for c in openssl curl nsenter ip go cargo python3; do
  command -v "$c" >/dev/null || die "$c is missing"
done

# --- what runs: built here, each a no-op when up to date ------------------------------------
say "building: kube-apiserver, etcd, kwok and the loader (scripts/k8s.sh), the agent and the bench"
bash scripts/k8s.sh build --only "kubernetes etcd kwok"
eval "$(bash scripts/k8s.sh paths)"
for b in "$K8S_BIN/kube-apiserver" "$K8S_BIN/kubectl" "$ETCD_BIN/etcd" "$KWOK_BIN/kwok" "$KWOK_BIN/scale-load"; do
  [ -x "$b" ] || die "$b was not built (bash scripts/k8s.sh build --only \"kubernetes etcd kwok\")"
done
cargo build --release --quiet --bin netpol-agent
if [ "$smoke" = 1 ]; then
  bench_build=(cargo build --bench kube_real --message-format=json)
else
  bench_build=(cargo bench --bench kube_real --no-run --message-format=json)
fi
BENCH=$("${bench_build[@]}" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "kube_real" and m.get("executable"):
        print(m["executable"])')
[ -x "$BENCH" ] || die "benches/kube_real.rs did not build (${bench_build[*]})"
# kwok's own stage definitions (node initialised Ready; pods Running with an IP from their
# node's podCIDR; deletion completed), from the module it was built from: no heartbeats, so
# kwok is silent once the cluster is up and "at rest" is the agents' rest.
KWOK_SRC=$(cd e2e/k8s/build/kwok && GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')

# --- cleanup, armed before anything is made --------------------------------------------------
WORK=$(mktemp -d /tmp/kube-scale.XXXXXX)
API_NS=nks-$$
PIDS=()
BENCH_PID=""
cleanup() {
  local rc=$? pid ns i
  trap - EXIT INT TERM
  set +e
  if [ -n "$BENCH_PID" ] && kill -0 "$BENCH_PID" 2>/dev/null; then kill "$BENCH_PID"; wait "$BENCH_PID" 2>/dev/null; fi
  # The bench's namespaces if it died before removing them: their processes (its agents and
  # their iptables/ipset children, found by the namespace they live in) first.
  if [ -n "$BENCH_PID" ]; then
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^npa-test-$BENCH_PID-"); do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
      ip netns del "$ns" 2>/dev/null
    done
  fi
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[$i]}" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  ip netns del "$API_NS" 2>/dev/null
  if [ "$keep" = 1 ]; then
    say "work directory (logs) kept: $WORK"
  else
    # A failed run's logs are printed before they go: nothing of a run outlives it.
    if [ "$rc" != 0 ]; then
      for f in "$WORK"/*.log; do
        [ -s "$f" ] || continue
        echo "--- $(basename "$f"), last lines:" >&2
        tail -5 "$f" >&2
      done
    fi
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts a long-running process in the API server's namespace, its output to WORK/NAME.log.
# nsenter execs the program, so $! is the program's own pid (its CPU and RSS are read there).
start() { # NAME CMD...
  local name=$1
  shift
  nsenter --net="/run/netns/$API_NS" -- "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$WORK/$name.pid"
}
wait_for() { # SECONDS NAME CMD...
  local max=$1 name=$2 deadline
  shift 2
  deadline=$((SECONDS + max))
  until "$@" >/dev/null 2>&1; do
    kill -0 "$(cat "$WORK/$name.pid")" 2>/dev/null || { tail -15 "$WORK/$name.log" >&2; die "$name exited"; }
    [ $SECONDS -lt "$deadline" ] || { tail -15 "$WORK/$name.log" >&2; die "$name not up within $max s"; }
    sleep 0.5
  done
}

say "$(date -u +%FT%TZ): $nodes nodes, $pods pods, $namespaces namespaces, $policies policies; agents $agents; work $WORK"
ip netns add "$API_NS"
ip netns exec "$API_NS" sh -c 'ip link set lo up && ip link add br0 type bridge && ip addr add 10.99.0.1/16 dev br0 && ip link set br0 up'

# --- certificates: one CA, TLS everywhere, as a real control plane (scripts/lib/pki.sh) ------
PKI=$WORK/pki
pki_ca netpol-scale-ca 2
pki_cert 2 apiserver kube-apiserver "" "DNS:kubernetes,DNS:localhost,IP:127.0.0.1,IP:10.99.0.1" server
pki_cert 2 etcd etcd "" "DNS:localhost,IP:127.0.0.1" both
pki_cert 2 apiserver-etcd-client kube-apiserver-etcd-client "" "" client
pki_cert 2 admin kubernetes-admin system:masters "" client
openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
kubeconfig() { pki_kubeconfig "$1" scale admin "$2"; } # FILE SERVER
kubeconfig "$WORK/local.kubeconfig" https://127.0.0.1:6443
api_curl() { ip netns exec "$API_NS" curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:6443$1"; }

# --- control plane: etcd, kube-apiserver (no controller-manager, scheduler or kubelet) --------
say "etcd $ETCD_VERSION, kube-apiserver $K8S_VERSION ${gates[*]}"
start etcd "$ETCD_BIN/etcd" --name scale --data-dir "$WORK/etcd" \
  --listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster scale=http://127.0.0.1:2380 \
  --cert-file "$PKI/etcd.crt" --key-file "$PKI/etcd.key" --client-cert-auth \
  --trusted-ca-file "$PKI/ca.crt" --listen-metrics-urls http://127.0.0.1:2381 \
  --snapshot-count 10000 --quota-backend-bytes 8589934592
wait_for 60 etcd ip netns exec "$API_NS" curl -sf http://127.0.0.1:2381/health
# ServiceAccount admission is off: without a controller-manager no namespace gets its
# `default` ServiceAccount, and the plugin would refuse every pod.
start kube-apiserver "$K8S_BIN/kube-apiserver" \
  --advertise-address 10.99.0.1 --bind-address 0.0.0.0 --secure-port 6443 \
  --etcd-servers https://127.0.0.1:2379 --etcd-cafile "$PKI/ca.crt" \
  --etcd-certfile "$PKI/apiserver-etcd-client.crt" --etcd-keyfile "$PKI/apiserver-etcd-client.key" \
  --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --authorization-mode RBAC --disable-admission-plugins ServiceAccount \
  --service-cluster-ip-range 10.96.0.0/16 --profiling=false "${gates[@]}"
wait_for 180 kube-apiserver api_curl /readyz

# --- the agents' identity: the shipped RBAC and a token of its ServiceAccount ---------------
kubectl() { ip netns exec "$API_NS" "$K8S_BIN/kubectl" --kubeconfig "$WORK/local.kubeconfig" "$@"; }
# kube-system is made by the API server itself, shortly after it is ready.
wait_for 60 kube-apiserver kubectl get namespace kube-system
kubectl apply -f deploy/base/serviceaccount.yaml -f deploy/base/clusterrole.yaml \
  -f deploy/base/clusterrolebinding.yaml | sed 's/^/  /'
pki_kubeconfig_token "$WORK/agent.kubeconfig" scale \
  "$(kubectl create token netpol-agent --namespace kube-system --duration 24h)" https://10.99.0.1:6443

# --- kwok and the cluster --------------------------------------------------------------------
# kwok plays 4 pod stages at a time by default: at 150k pods, with every status write waiting
# on a busy API server, that made 36-54 pods Running a second, far behind the loader. 16 made
# 80-150 a second (more would race kwok's own writes more often: it sometimes patches a pod
# twice at once, and the API server refuses the second for its two addresses; kwok retries).
# Its per-write INFO log line is left out (WARN).
STAGES=$WORK/kwok-stages.yaml
{
  cat <<'KWOKCONFIG'
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 16
---
KWOKCONFIG
  for f in node/fast/node-initialize.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cat "$KWOK_SRC/kustomize/stage/$f"
    echo "---"
  done
} >"$STAGES"
say "kwok $KWOK_VERSION"
start kwok "$KWOK_BIN/kwok" --kubeconfig "$WORK/local.kubeconfig" --manage-all-nodes=true \
  --config "$STAGES" -v WARN
sleep 1
kill -0 "$(cat "$WORK/kwok.pid")" 2>/dev/null || { tail -15 "$WORK/kwok.log" >&2; die "kwok exited"; }

say "the synthetic cluster (benches/support/synthetic.rs) and its loading"
"$BENCH" emit --out "$WORK/cluster.jsonl" --pods "$pods" --nodes "$nodes" \
  --namespaces "$namespaces" --policies "$policies" --local 110
t=$SECONDS
nsenter --net="/run/netns/$API_NS" -- "$KWOK_BIN/scale-load" load --kubeconfig "$WORK/local.kubeconfig" \
  --objects "$WORK/cluster.jsonl" --nodes "$nodes" --workers "$workers" | sed 's/^/  /'
say "loaded in $((SECONDS - t)) s; kube-apiserver RSS $(awk '/VmRSS/ {printf "%.0f MiB", $2/1024}' "/proc/$(cat "$WORK/kube-apiserver.pid")/status"), etcd $(awk '/VmRSS/ {printf "%.0f MiB", $2/1024}' "/proc/$(cat "$WORK/etcd.pid")/status")"

# --- the agents --------------------------------------------------------------------------------
churn_args=()
if [ "$churn" != 0 ]; then
  churn_args=(--churn "nsenter --net=/run/netns/$API_NS -- $KWOK_BIN/scale-load churn --kubeconfig $WORK/local.kubeconfig --rate $churn --seconds $churn_seconds --nodes $nodes --namespaces $namespaces --policies $policies")
fi
bench_args=()
[ "$smoke" = 1 ] && bench_args+=(--check)
if [ "$probes" != 0 ]; then
  bench_args+=(--probes "$probes" --probe "nsenter --net=/run/netns/$API_NS -- $KWOK_BIN/scale-load probe --kubeconfig $WORK/local.kubeconfig")
fi
"$BENCH" agents --kubeconfig "$WORK/agent.kubeconfig" --api-netns "$API_NS" \
  --api-pid "$(cat "$WORK/kube-apiserver.pid")" --etcd-pid "$(cat "$WORK/etcd.pid")" \
  --metrics "ip netns exec $API_NS curl -s --cacert $PKI/ca.crt --cert $PKI/admin.crt --key $PKI/admin.key https://127.0.0.1:6443/metrics" \
  --counts "$agents" --rest "$rest" "${churn_args[@]}" "${bench_args[@]}" &
BENCH_PID=$!
wait "$BENCH_PID"
BENCH_PID=""
say "done $(date -u +%FT%TZ)"
