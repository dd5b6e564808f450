#!/usr/bin/env bash
# The demo: compiles the example shop (examples/demo) for node-1, loads the result into a
# throwaway network namespace with ipset restore and iptables-restore, shows what the kernel
# now holds, and removes the namespace. Nothing outside that namespace is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

cargo build --release --locked --quiet
bin=target/release/netpol-agent
work=$(mktemp -d)
ns="npa-demo-$$"
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT INT TERM

echo "== compile examples/demo for node-1 (pods web and api are local)"
"$bin" compile --manifests examples/demo --node node-1 \
  --ipsets-out "$work/ipsets" --iptables-out "$work/iptables"
echo
echo "== load into network namespace $ns"
ip netns add "$ns"
ip netns exec "$ns" ipset restore < "$work/ipsets"
ip netns exec "$ns" iptables-legacy-restore --noflush < "$work/iptables"
echo
echo "== ipset list (selector and named-port sets)"
ip netns exec "$ns" ipset list | grep -E '^(Name|Type|Members|[0-9])'
echo
echo "== iptables-save -t filter"
ip netns exec "$ns" iptables-legacy-save -t filter | grep -v '^#'
echo
echo "== the API pod's ingress chain, as iptables -L shows it"
# Calico naming: "cali" + the first 11 hex characters of sha1("<namespace>.<pod>").
api_iface="cali$(printf 'shop.api' | sha1sum | cut -c1-11)"
ip netns exec "$ns" iptables-legacy -L "cali-tw-$api_iface" -n --line-numbers
echo
echo "demo done; namespace $ns removed"
