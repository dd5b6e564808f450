#!/usr/bin/env bash
# Installs what netpol-agent's build, tests and demo need on a Debian machine (as root),
# only when it is missing. Sourced by test.sh and demo.sh.
set -euo pipefail

need_pkgs=()
command -v iptables-legacy-restore >/dev/null 2>&1 || need_pkgs+=(iptables)
command -v ipset >/dev/null 2>&1 || need_pkgs+=(ipset)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v conntrack >/dev/null 2>&1 || need_pkgs+=(conntrack)
# scripts/ipvs-e2e.sh: kube-proxy's IPVS mode on the simulated nodes (in the VM).
command -v ipvsadm >/dev/null 2>&1 || need_pkgs+=(ipvsadm)
# The bridge-mode tests run small TCP servers and clients in namespaces.
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3)
# The k8s-cri crate generates the CRI gRPC bindings at build time with protoc.
command -v protoc >/dev/null 2>&1 || need_pkgs+=(protobuf-compiler)
# tests/containerd_netns.rs: containerd (its CRI plugin), runc, the CNI reference plugins;
# gcc with a static libc builds the pause image (no registry is reachable).
command -v containerd >/dev/null 2>&1 || need_pkgs+=(containerd)
[ -x /usr/lib/cni/ptp ] || need_pkgs+=(containernetworking-plugins)
# tests/flow_page_browser.rs: the flow-log page in headless Chromium, driven over WebDriver.
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_pkgs+=(chromium-driver)
{ command -v gcc >/dev/null 2>&1 && [ -e "/usr/lib/$(gcc -print-multiarch)/libc.a" ]; } || need_pkgs+=(gcc libc6-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo is missing: install a Rust toolchain (rustup)"; exit 1; }

# Network namespaces left behind by a killed test run. Ours are all named
# npa-<kind>-<pid of the process that made them>-...; one whose process is still alive belongs
# to a run going on beside this one and is left alone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^npa-' || true); do
  owner=$(printf '%s\n' "$ns" | awk -F- '{ for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) { print $i; exit } }')
  if [ -n "$owner" ] && [ -d "/proc/$owner" ]; then continue; fi
  ip netns del "$ns" 2>/dev/null || true
done
