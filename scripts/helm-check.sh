#!/usr/bin/env bash
# The Helm chart (deploy/helm/netpol-agent) against the kustomize manifests it is made from
# (issue 37): `helm lint`, and for the base and every overlay of deploy/overlays/ the objects
# `helm template` renders with `cni` set to it are the objects `kubectl kustomize` renders
# from that directory, field for field (comments aside; env, volumes and mounts compared by
# name); likewise the monitoring pack with every `monitoring` value on. Needs the helm and
# kubectl of `bash scripts/k8s.sh build`. Ends with `N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/k8s.sh paths)"
HELM=$HELM_BIN/helm
KUBECTL=$K8S_BIN/kubectl
CHART=deploy/helm/netpol-agent
# `helm template` assumes Kubernetes 1.20 unless told; the chart's kubeVersion starts at 1.33.
# Its notes about following the chart's symbolic links (files/ and crds/ point into deploy/)
# go to stderr, which is kept for failures only.
template() { "$HELM" template netpol-agent "$CHART" --kube-version "$K8S_VERSION" "$@" 2>>"$work/helm-stderr"; }
for b in "$HELM" "$KUBECTL"; do [ -x "$b" ] || { echo "helm-check: $b is missing (bash scripts/k8s.sh build)" >&2; exit 2; }; done
work=$(mktemp -d)
trap 'rc=$?; [ $rc -eq 0 ] || grep -v "found symbolic link" "$work/helm-stderr" 2>/dev/null; rm -rf "$work" target/helm-check-startup-taint; exit $rc' EXIT
passed=0 failed=0
ok() { echo "passed  $*"; passed=$((passed + 1)); }
bad() { echo "FAILED  $*"; failed=$((failed + 1)); }

if "$HELM" lint --strict "$CHART" >"$work/lint" 2>&1; then ok "helm lint --strict"; else cat "$work/lint"; bad "helm lint --strict"; fi

# Compares two multi-document YAML streams as sets of objects.
same() { # A B WHAT
  python3 - "$1" "$2" "$3" <<'PY'
import sys, yaml
def load(path):
    objs = {}
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for key, by in (("env", "name"), ("volumeMounts", "mountPath")):
                if key in c:
                    c[key] = sorted(c[key], key=lambda x: x[by])
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        if "volumes" in spec:
            spec["volumes"] = sorted(spec["volumes"], key=lambda x: x["name"])
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        objs[key] = doc
    return objs
a, b = load(sys.argv[1]), load(sys.argv[2])
if a == b:
    sys.exit(0)
for k in sorted(set(a) | set(b)):
    if a.get(k) != b.get(k):
        print(f"{sys.argv[3]}: {k} differs:\n  helm:      {a.get(k)}\n  kustomize: {b.get(k)}"[:3000])
sys.exit(1)
PY
}

for overlay in auto $(ls deploy/overlays); do
  if [ "$overlay" = auto ]; then dir=deploy/; else dir=deploy/overlays/$overlay/; fi
  template --namespace kube-system --set cni="$overlay" >"$work/helm.yaml"
  "$KUBECTL" kustomize "$dir" >"$work/kustomize.yaml"
  if same "$work/helm.yaml" "$work/kustomize.yaml" "cni=$overlay"; then
    ok "helm template --set cni=$overlay renders what kubectl kustomize $dir does"
  else
    bad "helm template --set cni=$overlay differs from kubectl kustomize $dir"
  fi
done

template --namespace kube-system --set monitoring.service=true \
  --set monitoring.serviceMonitor=true --set monitoring.prometheusRule=true --set monitoring.dashboard=true >"$work/helm.yaml"
{ "$KUBECTL" kustomize deploy/; echo "---"; "$KUBECTL" kustomize deploy/monitoring/; } >"$work/kustomize.yaml"
if same "$work/helm.yaml" "$work/kustomize.yaml" "monitoring"; then
  ok "helm template with the monitoring pack renders deploy/ and deploy/monitoring/"
else
  bad "helm template with the monitoring pack differs from deploy/ and deploy/monitoring/"
fi

# The startup taint: what the component adds to deploy/ in an operator's kustomization.
# (kustomize takes relative paths only: the kustomization sits in target/.)
own=target/helm-check-startup-taint
rm -rf "$own" && mkdir -p "$own"
printf 'resources: [../../deploy]\ncomponents: [../../deploy/components/startup-taint]\n' >"$own/kustomization.yaml"
template --namespace kube-system --set startupTaint=netpol-agent.io/agent-not-ready >"$work/helm.yaml"
"$KUBECTL" kustomize "$own" >"$work/kustomize.yaml"
if same "$work/helm.yaml" "$work/kustomize.yaml" "startupTaint"; then
  ok "helm template --set startupTaint renders deploy/ with deploy/components/startup-taint"
else
  bad "helm template --set startupTaint differs from deploy/ with deploy/components/startup-taint"
fi
if "$HELM" template netpol-agent "$CHART" --kube-version "$K8S_VERSION" --set startupTaint='not a key' >/dev/null 2>"$work/err"; then
  bad "an invalid startupTaint was accepted"
else
  grep -q "startupTaint" "$work/err" && ok "an invalid startupTaint is refused by the values schema" || { cat "$work/err"; bad "an invalid startupTaint was refused without naming it"; }
fi

# The schema refuses what the chart cannot render.
if "$HELM" template netpol-agent "$CHART" --kube-version "$K8S_VERSION" --set cni=weave >/dev/null 2>"$work/err"; then
  bad "an unknown cni was accepted"
else
  grep -q "cni" "$work/err" && ok "an unknown cni is refused by the values schema" || { cat "$work/err"; bad "an unknown cni was refused without naming it"; }
fi
# Values reach the DaemonSet: an extra variable, replacing one of the DaemonSet's.
template --set env.FELIX_LOGSEVERITYSCREEN=Debug --set env.FELIX_DENYLOGENABLED=true >"$work/helm.yaml"
if python3 - "$work/helm.yaml" <<'PY'
import sys, yaml
ds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet"][0]
env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
names = [e["name"] for e in env]
assert names.count("FELIX_LOGSEVERITYSCREEN") == 1, names
assert {"name": "FELIX_LOGSEVERITYSCREEN", "value": "Debug"} in env, env
assert {"name": "FELIX_DENYLOGENABLED", "value": "true"} in env, env
PY
then ok "env values replace or add the DaemonSet's variables"; else bad "env values did not reach the DaemonSet as expected"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
