#!/usr/bin/env bash
# Real Kubernetes from sources (issue 36): builds pinned upstream components from the Go module
# proxy, and the container images a cluster on this machine needs, without a registry.
#
#   bash scripts/k8s.sh build [--k8s VERSION|all] [--no-images] [--only "STEP..."]
#       Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#       kube-proxy, kubectl, e2e.test, ginkgo, agnhost, the conformance image's go-runner),
#       etcd, containerd (+ its runc shim and ctr), sonobuoy, network-policy-api's conformance
#       suite, helm, pause; then the images (below). kwok and the scale bench's loader
#       (scripts/kube-scale.sh) only when --only names kwok. Versions: e2e/k8s/versions.env; each Go build
#       has its own pinned module (go.mod + go.sum) under e2e/k8s/build/. --k8s picks the
#       Kubernetes release (default: K8S_DEFAULT; `all`: every one of K8S_VERSIONS). --only
#       builds the steps named (kubernetes etcd containerd runc sonobuoy helm network-policy-api
#       kwok) and
#       no images: the scale bench needs three of them, not the whole cluster's kit.
#   bash scripts/k8s.sh images [--k8s VERSION]
#       The images only: pause and agnhost under the names the e2e binary asks for, the
#       conformance image and sonobuoy's for `sonobuoy run`, and the agent's image built from
#       deploy/Dockerfile over base images made here with debootstrap (buildah, no registry,
#       no Docker engine). Saved as docker-archive tarballs for `ctr images import`.
#   bash scripts/k8s.sh paths [--k8s VERSION]
#       Prints where everything is (KEY=value lines, sourced by the cluster script). Without
#       --k8s: the release of the cluster that is up (scripts/k8s-cluster.sh), else K8S_DEFAULT,
#       so the suites' binaries and images match the cluster they run against.
#
# Everything goes to target/k8s/ (NETPOL_K8S_DIR). Each step leaves a stamp holding a hash of
# its inputs (pinned module, versions, the Go toolchain, this script); a second run with the
# same inputs does nothing. A module that cannot be fetched stops the build naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=../e2e/k8s/versions.env
source e2e/k8s/versions.env
OUT=${NETPOL_K8S_DIR:-$ROOT/target/k8s}
export GOTOOLCHAIN=local
export CGO_ENABLED=0

say() { echo "=== k8s.sh: $*"; }
die() { echo "k8s.sh: $*" >&2; exit 1; }

k8s_version=$K8S_DEFAULT
want_images=1
only=""
cmd=${1:-build}
shift || true
if [ "$cmd" = paths ]; then
  cell=${NETPOL_K8S_CLUSTER:-$OUT/cluster}/cell
  up_version=$(sed -n 's/.*kubernetes=v\([^ ]*\).*/\1/p' "$cell" 2>/dev/null || true)
  [ -n "$up_version" ] && k8s_version=$up_version
fi
while [ $# -gt 0 ]; do
  case "$1" in
    --k8s) k8s_version=$2; shift 2 ;;
    --no-images) want_images=0; shift ;;
    --only) only=$2; want_images=0; shift 2 ;;
    *) die "unknown option $1 (see the header of scripts/k8s.sh)" ;;
  esac
done
if [ "$k8s_version" = all ]; then k8s_list=$K8S_VERSIONS; else k8s_list=$k8s_version; fi
for v in $k8s_list; do
  case " $K8S_VERSIONS " in *" $v "*) ;; *) die "Kubernetes $v is not one of K8S_VERSIONS ($K8S_VERSIONS)" ;; esac
done

minor_of() { echo "$1" | cut -d. -f2; }
# The per-minor image versions (AGNHOST_1_37, PAUSE_1_37, ...).
agnhost_of() { local n="AGNHOST_1_$(minor_of "$1")"; echo "${!n}"; }
pause_of() { local n="PAUSE_1_$(minor_of "$1")"; echo "${!n}"; }

# A hash of a step's inputs: the named files, the Go toolchain and this script.
inputs_hash() {
  { go version; cat "$0"; for f in "$@"; do echo "== $f"; cat "$f"; done; } | sha256sum | cut -c1-16
}

# Runs a build step unless its stamp matches (or --only leaves it out):
# step NAME STAMPFILE HASH FUNCTION [ARGS...]
step() {
  local name=$1 stamp=$2 hash=$3
  shift 3
  if [ -n "$only" ] && [[ " $only " != *" ${name%% *} "* ]]; then return 0; fi
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
    say "$name: up to date"
    return 0
  fi
  local start=$SECONDS
  say "$name: building"
  "$@"
  mkdir -p "$(dirname "$stamp")"
  echo "$hash" >"$stamp"
  say "$name: done in $((SECONDS - start)) s"
}

# Downloads a module's dependencies, naming any that cannot be fetched.
fetch_modules() {
  local dir=$1 log
  log=$(mktemp)
  if ! (cd "$dir" && go mod download -x) >"$log" 2>&1; then
    echo "k8s.sh: modules of $dir could not be fetched from $(go env GOPROXY):" >&2
    grep -E 'reading|verifying|dial|404|403|410|not found|missing' "$log" | sort -u | head -20 >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

# The commit a module version was tagged from, as the proxy records it ("" if unknown).
origin_hash() {
  go mod download -json "$1" 2>/dev/null | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("Origin", {}).get("Hash", ""))
except Exception: print("")'
}

build_kubernetes() {
  local v=$1 minor mod bin commit ldflags
  minor=$(minor_of "$v")
  mod=e2e/k8s/build/kubernetes-1.$minor
  bin=$OUT/kubernetes-$v/bin
  fetch_modules "$mod"
  commit=$(cd "$mod" && origin_hash "k8s.io/kubernetes@v$v")
  # What `kubectl version` and sonobuoy read (sonobuoy picks the conformance image by it).
  local vp=k8s.io/component-base/version
  ldflags="-s -w -X $vp.gitVersion=v$v -X $vp.gitMajor=1 -X $vp.gitMinor=$minor \
    -X $vp.gitCommit=$commit -X $vp.gitTreeState=clean -X $vp.buildDate=1970-01-01T00:00:00Z \
    -X k8s.io/client-go/pkg/version.gitVersion=v$v -X k8s.io/client-go/pkg/version.gitMajor=1 \
    -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  mkdir -p "$bin"
  # One go build for all programs: the packages they share compile once.
  (cd "$mod" && go build -trimpath -mod=readonly -ldflags "$ldflags" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/test/images/agnhost k8s.io/kubernetes/test/conformance/image/go-runner \
    github.com/onsi/ginkgo/v2/ginkgo)
  # Upstream's e2e binary, every spec linked in (test/e2e/network/netpol among them).
  (cd "$mod" && go test -c -trimpath -mod=readonly -ldflags "$ldflags" -o "$bin/e2e.test" \
    k8s.io/kubernetes/test/e2e)
  "$bin/e2e.test" --list-images >"$OUT/kubernetes-$v/images.txt" 2>/dev/null \
    || die "e2e.test --list-images failed for $v"
  # pause: upstream's static C program, from the module's source.
  local src
  src=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@v$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  gcc -Os -Wall -Werror -static -DVERSION="v$(pause_of "$v")-netpol" \
    -o "$bin/pause" "$src/build/pause/linux/pause.c"
}

build_etcd() {
  local mod=e2e/k8s/build/etcd
  fetch_modules "$mod"
  mkdir -p "$OUT/etcd-$ETCD_VERSION/bin"
  (cd "$mod" && go build -trimpath -mod=readonly -ldflags "-s -w" \
    -o "$OUT/etcd-$ETCD_VERSION/bin/etcd" .)
  (cd "$mod" && go build -trimpath -mod=readonly -ldflags "-s -w" \
    -o "$OUT/etcd-$ETCD_VERSION/bin/etcdctl" go.etcd.io/etcd/etcdctl/v3)
}

build_containerd() {
  local mod=e2e/k8s/build/containerd bin=$OUT/containerd-$CONTAINERD_VERSION/bin
  fetch_modules "$mod"
  mkdir -p "$bin"
  (cd "$mod" && go build -trimpath -mod=readonly -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION" \
    -o "$bin/" github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr)
}

# A module's own source, in a writable copy under target/k8s (the module cache is read-only),
# its go.mod and go.sum as released (verified against the checksum database when fetched).
# `go install module@version` cannot be used: it asks the proxy for the module's version list
# (for deprecation notices), which the proxy refuses for some modules (sonobuoy: 403).
module_copy() { # MODULE@VERSION WORKDIR
  local src
  src=$(go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') \
    || die "$1 could not be fetched from $(go env GOPROXY)"
  rm -rf "$2"
  mkdir -p "$2"
  cp -r "$src/." "$2/"
  chmod -R u+w "$2"
  fetch_modules "$2"
}

# runc, the release containerd pins (script/setup/runc-version): Debian 12's 1.1.5 cannot
# start containerd 2.x's containers ("can't get final child's PID from pipe"). cgo with
# libseccomp, so that RuntimeDefault seccomp profiles apply.
build_runc() {
  local bin=$OUT/runc-$RUNC_VERSION/bin work=$OUT/runc-$RUNC_VERSION/src
  module_copy "github.com/opencontainers/runc@v$RUNC_VERSION" "$work"
  mkdir -p "$bin"
  (cd "$work" && CGO_ENABLED=1 go build -trimpath -mod=readonly -tags seccomp \
    -ldflags "-s -w -X main.version=$RUNC_VERSION" -o "$bin/runc" .)
}

build_sonobuoy() {
  local bin=$OUT/sonobuoy-$SONOBUOY_VERSION/bin work=$OUT/sonobuoy-$SONOBUOY_VERSION/src
  module_copy "github.com/vmware-tanzu/sonobuoy@v$SONOBUOY_VERSION" "$work"
  mkdir -p "$bin"
  # With the Go release its go.mod names (SONOBUOY_GO): from Go 1.24 on, net/url refuses
  # the bracketed IPv4 address sonobuoy builds its aggregator URL from ("https://[10.244.1.80]:
  # 8080": invalid IP-literal), so a sonobuoy built with today's Go cannot report results.
  (cd "$work" && GOTOOLCHAIN=go$SONOBUOY_GO go build -trimpath -mod=readonly \
    -ldflags "-s -w -X github.com/vmware-tanzu/sonobuoy/pkg/buildinfo.Version=v$SONOBUOY_VERSION" \
    -o "$bin/sonobuoy" .) || die "sonobuoy v$SONOBUOY_VERSION did not build with go$SONOBUOY_GO"
}

build_helm() {
  local bin=$OUT/helm-$HELM_VERSION/bin work=$OUT/helm-$HELM_VERSION/src
  module_copy "helm.sh/helm/v3@v$HELM_VERSION" "$work"
  mkdir -p "$bin"
  (cd "$work" && go build -trimpath -mod=readonly \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    -o "$bin/helm" ./cmd/helm)
}

build_npa() {
  local bin=$OUT/network-policy-api-$NPA_VERSION/bin work=$OUT/network-policy-api-$NPA_VERSION/src
  module_copy "sigs.k8s.io/network-policy-api@v$NPA_VERSION" "$work"
  mkdir -p "$bin"
  (cd "$work" && go test -c -trimpath -mod=readonly -o "$bin/conformance.test" ./conformance)
  # The same suite for kernels without SCTP: its base pods' SCTP servers removed (see
  # e2e/k8s/npa_without_sctp.py); scripts/k8s-conformance.sh picks it only on such a kernel.
  python3 "$ROOT/e2e/k8s/npa_without_sctp.py" "$work/conformance/base/manifests.yaml" >/dev/null
  (cd "$work" && go test -c -trimpath -mod=readonly -o "$bin/conformance-nosctp.test" ./conformance)
}

# kwok (fake nodes and pod status for scripts/kube-scale.sh) and that bench's loader, which
# creates the synthetic cluster through client-go: one module, so both use the client-go
# release kwok pins.
build_kwok() {
  local mod=e2e/k8s/build/kwok bin=$OUT/kwok-$KWOK_VERSION/bin
  fetch_modules "$mod"
  mkdir -p "$bin"
  (cd "$mod" && go build -trimpath -mod=readonly \
    -ldflags "-s -w" \
    -o "$bin/" sigs.k8s.io/kwok/cmd/kwok ./scale-load)
}

build_all() {
  for v in $k8s_list; do
    local mod
    mod=e2e/k8s/build/kubernetes-1.$(minor_of "$v")
    step "kubernetes v$v" "$OUT/kubernetes-$v/.stamp" \
      "$(inputs_hash "$mod/go.mod" "$mod/go.sum" e2e/k8s/versions.env)" build_kubernetes "$v"
  done
  step "etcd v$ETCD_VERSION" "$OUT/etcd-$ETCD_VERSION/.stamp" \
    "$(inputs_hash e2e/k8s/build/etcd/go.mod e2e/k8s/build/etcd/go.sum e2e/k8s/build/etcd/main.go)" build_etcd
  step "containerd v$CONTAINERD_VERSION" "$OUT/containerd-$CONTAINERD_VERSION/.stamp" \
    "$(inputs_hash e2e/k8s/build/containerd/go.mod e2e/k8s/build/containerd/go.sum)" build_containerd
  step "runc v$RUNC_VERSION" "$OUT/runc-$RUNC_VERSION/.stamp" \
    "$(inputs_hash e2e/k8s/versions.env)" build_runc
  step "sonobuoy v$SONOBUOY_VERSION" "$OUT/sonobuoy-$SONOBUOY_VERSION/.stamp" \
    "$(inputs_hash e2e/k8s/versions.env)" build_sonobuoy
  step "helm v$HELM_VERSION" "$OUT/helm-$HELM_VERSION/.stamp" \
    "$(inputs_hash e2e/k8s/versions.env)" build_helm
  step "network-policy-api v$NPA_VERSION" "$OUT/network-policy-api-$NPA_VERSION/.stamp" \
    "$(inputs_hash e2e/k8s/versions.env e2e/k8s/npa_without_sctp.py)" build_npa
  # The scale bench's alone: built only when named (--only "... kwok"; the test command names
  # it in a build of its own, for the bench's smoke), so the cluster's builds do not carry it.
  if [[ " $only " == *" kwok "* ]]; then
    step "kwok v$KWOK_VERSION" "$OUT/kwok-$KWOK_VERSION/.stamp" \
      "$(inputs_hash e2e/k8s/build/kwok/go.mod e2e/k8s/build/kwok/go.sum e2e/k8s/build/kwok/scale-load/main.go)" build_kwok
  fi
}

print_paths() {
  local v=${k8s_list%% *}
  cat <<EOF
K8S_VERSION=$v
K8S_BIN=$OUT/kubernetes-$v/bin
ETCD_BIN=$OUT/etcd-$ETCD_VERSION/bin
CONTAINERD_BIN=$OUT/containerd-$CONTAINERD_VERSION/bin
RUNC_BIN=$OUT/runc-$RUNC_VERSION/bin
SONOBUOY_BIN=$OUT/sonobuoy-$SONOBUOY_VERSION/bin
NPA_BIN=$OUT/network-policy-api-$NPA_VERSION/bin
HELM_BIN=$OUT/helm-$HELM_VERSION/bin
KWOK_BIN=$OUT/kwok-$KWOK_VERSION/bin
IMAGES_DIR=$OUT/images
AGNHOST_VERSION=$(agnhost_of "$v")
PAUSE_VERSION=$(pause_of "$v")
EOF
}

case "$cmd" in
  build)
    command -v go >/dev/null || die "go is missing (Go 1.26 builds these)"
    command -v gcc >/dev/null || die "gcc is missing (pause is C); scripts/setup.sh installs it"
    if [ ! -e /usr/include/seccomp.h ] && { [ -z "$only" ] || [[ " $only " == *" runc "* ]]; }; then
      say "installing libseccomp-dev (runc's seccomp support)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev pkg-config >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev pkg-config >/dev/null; }
    fi
    total=$SECONDS
    build_all
    if [ "$want_images" = 1 ]; then
      for v in $k8s_list; do bash scripts/k8s-images.sh --k8s "$v"; done
    fi
    say "build: $((SECONDS - total)) s in all"
    ;;
  images)
    for v in $k8s_list; do bash scripts/k8s-images.sh --k8s "$v"; done
    ;;
  paths)
    print_paths
    ;;
  *)
    die "unknown command $cmd: build, images or paths"
    ;;
esac
