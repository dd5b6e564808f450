#!/usr/bin/env bash
# Upstream's suites against the cluster of scripts/k8s-cluster.sh (issue 36), each spec
# counted: the last line is `N passed, M failed, K skipped`, every failed and skipped spec
# named above it with the reason (a skip here is an environment the machine lacks, never a
# spec that would fail).
#
#   bash scripts/k8s-conformance.sh --suite netpol [--sonobuoy] [--focus REGEX] [--smoke]
#       Kubernetes' own [Feature:NetworkPolicy] specs (test/e2e/network/netpol), from the
#       e2e binary scripts/k8s.sh built: run directly with ginkgo (in parallel), or with
#       --sonobuoy through `sonobuoy run --plugin e2e` (the e2e binary in the conformance
#       image, in a pod of the cluster), as the seed's workflow does.
#   bash scripts/k8s-conformance.sh --suite cnp [--smoke]
#       network-policy-api v0.2.0's conformance suite, ClusterNetworkPolicy profile, with the
#       features the agent supports (the standard ones and named ports).
#
# --smoke: a fixed subset for the test command (12 NetworkPolicy specs; 2 ClusterNetworkPolicy
# tests). Results go to target/k8s/results/<suite>-<time>/ (junit, logs, the agents' logs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${NETPOL_K8S_CLUSTER:-$ROOT/target/k8s/cluster}
[ -f "$STATE/admin.kubeconfig" ] || { echo "k8s-conformance: no cluster is up (bash scripts/k8s-cluster.sh up)" >&2; exit 2; }
KUBECONFIG_PATH=$STATE/admin.kubeconfig
eval "$(bash scripts/k8s.sh paths)"
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH")
# shellcheck source=../e2e/k8s/versions.env
source e2e/k8s/versions.env

say() { echo "=== k8s-conformance: $*"; }
die() { echo "k8s-conformance: $*" >&2; exit 2; }

SUITE=
SONOBUOY=0
FOCUS=
SMOKE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE=$2; shift 2 ;;
    --sonobuoy) SONOBUOY=1; shift ;;
    --focus) FOCUS=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    *) die "unknown option $1" ;;
  esac
done
OUT=$ROOT/target/k8s/results/$SUITE-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
cp "$STATE/cell" "$OUT/cell" 2>/dev/null || true

# SCTP: this kernel has no SCTP sockets (no CONFIG_IP_SCTP), so no pod can serve or connect
# over it; the SCTP specs are skipped and named, with this reason.
SCTP_REASON="this kernel has no SCTP sockets (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails), so no pod can serve SCTP"
have_sctp() {
  python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132)' 2>/dev/null
}

# The agents' logs and the nodes' rules, whatever happened: evidence for every failure.
collect() {
  mkdir -p "$OUT/agents"
  for p in $("${KUBECTL[@]}" -n kube-system get pods -l app.kubernetes.io/name=netpol-agent -o name 2>/dev/null); do
    "${KUBECTL[@]}" -n kube-system logs "$p" >"$OUT/agents/${p#pod/}.log" 2>&1 || true
  done
  "${KUBECTL[@]}" get nodes -o wide >"$OUT/nodes.txt" 2>&1 || true
}
trap collect EXIT

netpol_focus() {
  if [ -n "$FOCUS" ]; then echo "$FOCUS"; return; fi
  if [ "$SMOKE" = 1 ]; then
    # Twelve specs across the kinds of rule: pod and namespace selectors, ports (numeric and
    # named), egress, CIDRs with except, policy updates and deletion, UDP.
    echo "Netpol .*(should support a 'default-deny-ingress' policy|should enforce policy to allow traffic from pods within server namespace based on PodSelector|should enforce policy based on PodSelector and NamespaceSelector|should enforce policy based on Ports|should allow ingress access on one named port|should allow egress access on one named port|should enforce updated policy|should deny egress from all pods in a namespace|should enforce except clause while egress access to server in CIDR block|should stop enforcing policies after they are deleted|should work with Ingress, Egress specified together|should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label).*\[Feature:NetworkPolicy\]"
    return
  fi
  echo '\[Feature:NetworkPolicy\]'
}

# Counts a junit report's test cases that the focus selected: passed, failed (with the
# message), skipped (with the reason); the e2e binary reports every spec it has, so specs the
# focus left out ("skipped" by ginkgo's filter) are not counted.
count_junit() { # FILE [REASON-FOR-SKIPS]
  python3 - "$@" <<'EOF'
import sys, xml.etree.ElementTree as ET
path = sys.argv[1]
reason = sys.argv[2] if len(sys.argv) > 2 else ""
root = ET.parse(path).getroot()
passed, failed, skipped = [], [], []
for case in root.iter("testcase"):
    name = case.get("name", "")
    if "[Feature:NetworkPolicy]" not in name and "Netpol" not in name:
        continue
    sk = case.find("skipped")
    fl = case.find("failure") if case.find("failure") is not None else case.find("error")
    if sk is not None:
        msg = (sk.get("message") or "").strip()
        # Left out by the focus or skip expression: not one of ours to count.
        if msg.startswith("skipped") and ("filter" in msg or "focus" in msg or msg == "skipped"):
            continue
        skipped.append((name, msg or reason))
    elif fl is not None:
        failed.append((name, (fl.get("message") or fl.text or "").strip().splitlines()[:3]))
    else:
        passed.append(name)
for n in passed:
    print(f"passed  {n}")
for n, m in failed:
    print(f"FAILED  {n}")
    for line in m:
        print(f"        {line[:300]}")
for n, m in skipped:
    print(f"skipped {n}: {m[:300]}")
print(f"{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
EOF
}

run_netpol_direct() {
  local focus skip nodes=4
  focus=$(netpol_focus)
  skip='\[Disruptive\]|\[Flaky\]'
  local skipped_by_env=""
  if ! have_sctp; then
    skip="$skip|\[Feature:SCTPConnectivity\]"
    skipped_by_env=$SCTP_REASON
  fi
  say "e2e.test (Kubernetes v$K8S_VERSION), ginkgo --procs $nodes, focus: $focus"
  set +e
  (cd "$OUT" && "$K8S_BIN/ginkgo" --procs "$nodes" --timeout 3h --no-color \
      --focus "$focus" --skip "$skip" --junit-report "$OUT/junit.xml" \
      "$K8S_BIN/e2e.test" -- --kubeconfig "$KUBECONFIG_PATH" --provider local \
      --disable-log-dump --report-dir "$OUT" --e2e-output-dir "$OUT" >"$OUT/e2e.log" 2>&1)
  local status=$?
  set -e
  [ -f "$OUT/junit.xml" ] || { tail -30 "$OUT/e2e.log" >&2; die "e2e.test wrote no report (status $status); log: $OUT/e2e.log"; }
  # The SCTP specs the skip left out are named with their reason, not dropped in silence.
  if [ -n "$skipped_by_env" ]; then
    "$K8S_BIN/e2e.test" --list-tests 2>/dev/null | grep -E "$focus" | grep -F "[Feature:SCTPConnectivity]" \
      | sed "s|^|skipped |; s|\$|: $skipped_by_env|" >"$OUT/skipped-env.txt" || true
  fi
  report "$OUT/junit.xml"
}

run_netpol_sonobuoy() {
  local focus skip
  focus=$(netpol_focus)
  skip='\[Disruptive\]|\[Flaky\]'
  have_sctp || skip="$skip|\[Feature:SCTPConnectivity\]"
  local sb=("$SONOBUOY_BIN/sonobuoy" --kubeconfig "$KUBECONFIG_PATH")
  # The suite images are not in a fresh cluster's nodes (k8s-cluster.sh up leaves them out).
  bash scripts/k8s-cluster.sh import conformance sonobuoy
  say "sonobuoy v$SONOBUOY_VERSION run --plugin e2e (conformance image v$K8S_VERSION), focus: $focus"
  "${sb[@]}" delete --all --wait >/dev/null 2>&1 || true
  # --skip-preflight: its only failing check is "no DNS pods"; this cluster runs no DNS and
  # nothing in these specs resolves a name (probes go to ClusterIPs, the e2e pod reaches the
  # API server by KUBERNETES_SERVICE_HOST, the worker the aggregator by its pod IP).
  "${sb[@]}" run --skip-preflight --plugin e2e --e2e-focus "$focus" --e2e-skip "$skip" \
    --sonobuoy-image "docker.io/sonobuoy/sonobuoy:v$SONOBUOY_VERSION" \
    --kube-conformance-image "registry.k8s.io/conformance:v$K8S_VERSION" \
    --image-pull-policy IfNotPresent --plugin-env e2e.E2E_PARALLEL=true \
    --wait=180 >"$OUT/sonobuoy-run.log" 2>&1 \
    || { tail -20 "$OUT/sonobuoy-run.log" >&2; "${sb[@]}" status >&2 || true; die "sonobuoy run failed; log: $OUT/sonobuoy-run.log"; }
  local tarball
  tarball=$(cd "$OUT" && "${sb[@]}" retrieve "$OUT")
  mkdir -p "$OUT/sonobuoy"
  tar -C "$OUT/sonobuoy" -xzf "$tarball"
  # `results` reads the archive alone and takes no --kubeconfig.
  "$SONOBUOY_BIN/sonobuoy" results "$tarball" >"$OUT/sonobuoy-results.txt" 2>&1 || true
  "${sb[@]}" delete --all --wait >/dev/null 2>&1 || true
  local junit
  junit=$(find "$OUT/sonobuoy/plugins/e2e" -name 'junit*.xml' | head -1)
  [ -n "$junit" ] || die "sonobuoy's results hold no junit report ($OUT/sonobuoy)"
  if ! have_sctp; then
    "$K8S_BIN/e2e.test" --list-tests 2>/dev/null | grep -E "$focus" | grep -F "[Feature:SCTPConnectivity]" \
      | sed "s|^|skipped |; s|\$|: $SCTP_REASON|" >"$OUT/skipped-env.txt" || true
  fi
  report "$junit"
}

# Prints the per-spec lines and the summary, counting the environment's skips too; exits 1
# when a spec failed or nothing ran.
report() {
  local counts extra=0
  counts=$(count_junit "$1")
  echo "$counts" | sed '$d' | tee "$OUT/specs.txt"
  if [ -s "$OUT/skipped-env.txt" ]; then
    cat "$OUT/skipped-env.txt" | tee -a "$OUT/specs.txt"
    extra=$(wc -l <"$OUT/skipped-env.txt")
  fi
  local p f s
  read -r p _ f _ s _ <<<"$(echo "$counts" | tail -1 | tr -d ',')"
  s=$((s + extra))
  echo "results: $OUT"
  echo "$p passed, $f failed, $s skipped"
  [ "$f" -eq 0 ] && [ "$p" -gt 0 ]
}

run_cnp() {
  local bin=$NPA_BIN/conformance.test run=TestConformanceProfiles
  local features=ClusterNetworkPolicy,ClusterNetworkPolicyNamedPorts
  local filter="" skip_args=()
  if [ "$SMOKE" = 1 ]; then
    filter="(CNPAdminTierIngressTCP|CNPAdminTierPriorityField)\$"
  fi
  [ -n "$FOCUS" ] && filter=$FOCUS
  if ! have_sctp; then
    # Without SCTP the base pods' SCTP servers cannot start: the suite built without them,
    # and its SCTP tests skipped, each named with the reason.
    bin=$NPA_BIN/conformance-nosctp.test
    # (-test.skip matches level by level: the suite's tests are its second level.)
    skip_args=(-test.skip 'TestConformanceProfiles/.*SCTP')
    for t in CNPAdminTierIngressSCTP CNPAdminTierEgressSCTP CNPBaselineTierIngressSCTP CNPBaselineTierEgressSCTP; do
      if [ -z "$filter" ] || echo "$t" | grep -qE "$filter"; then echo "skipped $t: $SCTP_REASON"; fi
    done >"$OUT/skipped-env.txt"
  fi
  # The suite's namespaces of an earlier run must be gone: it cannot create in a
  # terminating namespace.
  local deadline=$((SECONDS + 180))
  while "${KUBECTL[@]}" get ns -o name | grep -q 'network-policy-conformance-'; do
    [ $SECONDS -lt $deadline ] || die "the suite's namespaces of an earlier run are still there after 180 s"
    sleep 2
  done
  say "network-policy-api v$NPA_VERSION conformance, profile ClusterNetworkPolicy, features $features${filter:+, tests $filter}"
  set +e
  (cd "$OUT" && KUBECONFIG=$KUBECONFIG_PATH "$bin" -test.v -test.timeout 60m \
      -test.run "$run${filter:+/$filter}" "${skip_args[@]}" \
      --conformance-profiles=ClusterNetworkPolicy --supported-features="$features" \
      --organization=netpol-agent --project=netpol-agent --url=https://example.invalid/netpol-agent \
      --version="$(awk -F'"' '/^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")" \
      --contact=@netpol-agent --additional-info=scripts/k8s-conformance.sh \
      --report-output="$OUT/report.yaml" >"$OUT/conformance.log" 2>&1)
  set -e
  # One line per test of the suite (TestConformanceProfiles/<test>); a failed test lists
  # its failed cases. The suite skips the tests of features not claimed (node peers).
  python3 - "$OUT/conformance.log" <<'EOF' >"$OUT/specs-suite.txt"
import re, sys
status, cases, probes = {}, {}, {}
current = None
for line in open(sys.argv[1], errors="replace"):
    r = re.match(r"=== RUN\s+TestConformanceProfiles/([^/\s]+)", line)
    if r:
        current = r.group(1)
    # A failed probe: the command, then what it got.
    c = re.search(r"FAILED Command was \[(.*)\]", line)
    if c and current:
        probes.setdefault(current, []).append(["--protocol=sctp" in c.group(1), None])
    g = re.search(r"but instead it .*?: (.*)$", line)
    if g and current and probes.get(current) and probes[current][-1][1] is None:
        probes[current][-1][1] = g.group(1).strip()
    m = re.match(r"\s*--- (PASS|FAIL|SKIP): TestConformanceProfiles/([^/\s]+)(/(\S+))?", line)
    if not m:
        continue
    test, case = m.group(2), m.group(4)
    if case is None:
        status[test] = m.group(1)
    elif m.group(1) == "FAIL":
        cases.setdefault(test, []).append(case)

# A failure explained by the environment: every failed probe was SCTP, refused by the kernel.
def sctp_only(test):
    got = probes.get(test, [])
    return bool(got) and all(sctp and (why or "").endswith("protocol not supported") for sctp, why in got)

word = {"PASS": "passed ", "FAIL": "FAILED ", "SKIP": "skipped"}
explained = 0
for test, st in sorted(status.items()):
    note = ""
    if st == "SKIP":
        note = ": feature not claimed (the suite skips it)"
    elif st == "FAIL" and sctp_only(test):
        explained += 1
        note = (f": every one of its {len(probes[test])} failed probes was SCTP, refused with "
                "'protocol not supported' (this kernel has no SCTP); no TCP or UDP probe failed")
    print(f"{word[st]} {test}{note}")
    for case in cases.get(test, []):
        print(f"        failed case: {case}")
n = lambda x: sum(1 for v in status.values() if v == x)
setup_failed = not status and any(l.startswith("--- FAIL: TestConformanceProfiles") for l in open(sys.argv[1], errors="replace"))
if setup_failed:
    print("FAILED  the suite itself (before any test: its base resources; see conformance.log)")
print(f"explained {explained}")
print(f"{n('PASS')} passed, {n('FAIL') + int(setup_failed)} failed, {n('SKIP')} skipped")
EOF
  sed '$d' "$OUT/specs-suite.txt" | grep -v '^explained ' | tee "$OUT/specs.txt"
  local p f sk extra=0 explained
  read -r p _ f _ sk _ <<<"$(tail -1 "$OUT/specs-suite.txt" | tr -d ',')"
  explained=$(awk '/^explained / { print $2 }' "$OUT/specs-suite.txt")
  if [ -s "$OUT/skipped-env.txt" ]; then
    tee -a "$OUT/specs.txt" <"$OUT/skipped-env.txt"
    extra=$(wc -l <"$OUT/skipped-env.txt")
  fi
  echo "results: $OUT"
  if [ "$explained" -gt 0 ]; then
    echo "of the $f failed: $explained failed on SCTP probes alone, which this kernel cannot make; $((f - explained)) otherwise"
  fi
  echo "$p passed, $f failed, $((sk + extra)) skipped"
  # Success: something ran and every failure is explained by the machine.
  [ "$f" -eq "$explained" ] && [ "$p" -gt 0 ]
}

case "$SUITE" in
  netpol)
    if [ "$SONOBUOY" = 1 ]; then run_netpol_sonobuoy; else run_netpol_direct; fi ;;
  cnp) run_cnp ;;
  *) die "--suite netpol|cnp" ;;
esac
