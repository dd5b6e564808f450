#!/usr/bin/env bash
# What one legacy `iptables-restore --noflush` costs on a node's table, and how much of it is
# the comment matches (docs/development/benchmarks.md, "Where a legacy restore's time goes").
# Legacy iptables replaces the whole table blob on every commit, so the cost of any change,
# however small, follows the size of the table, not of the change.
#
#   bash scripts/restore-floor.sh [MANIFESTS] [NODE=node-0] [REPEATS=30]     (root)
#
# MANIFESTS default: the benchmarks' synthetic cluster (10k pods, 1k policies, 110 on node-0),
# written by `cargo bench --bench synthetic_manifests` when missing. The node's table comes
# from `netpol-agent compile` (target/release, built when missing). Three variants of the
# filter table are restored into a network namespace of this script's own (removed on exit,
# failure included; the host's tables are never touched), each then timed over REPEATS
# one-rule restores (p50 and max, `ip netns exec` included, about 3 ms here):
#   as-compiled   the agent's rules, felix's layout: a `cali:` id comment on every rule and
#                 felix's descriptive comments ("Return if profile accepted", ...)
#   ids-only      without the descriptive comments
#   no-comments   without any comment match
#   per-pod-head  as compiled, but with felix's own head in every workload chain: the rules
#                 of the shared `cali-wl-start` (conntrack, marks cleared) in place of the
#                 jump to it, as before it was shared (the table's size, same verdicts)
set -euo pipefail
cd "$(dirname "$0")/.."
MANIFESTS=${1:-target/restore-floor/synthetic-110.yaml}
NODE=${2:-node-0}
REPEATS=${3:-30}
WORK=target/restore-floor
NS=npa-floor-$$
mkdir -p "$WORK"
cleanup() { ip netns del "$NS" 2>/dev/null || true; }
trap cleanup EXIT

if [ ! -e "$MANIFESTS" ]; then
  cargo bench --bench synthetic_manifests -- "$MANIFESTS" >&2
fi
[ -x target/release/netpol-agent ] || cargo build --release >&2
target/release/netpol-agent compile --manifests "$MANIFESTS" --node "$NODE" 2>/dev/null >"$WORK/compiled.txt"
# The compile output is the ipset restore input, then the iptables-restore input.
awk '/^\*/ { t = 1 } !t' "$WORK/compiled.txt" >"$WORK/sets.txt"
awk '/^\*filter/ { t = 1 } t; /^COMMIT/ { t = 0 }' "$WORK/compiled.txt" >"$WORK/as-compiled.txt"
perl -pe 's/ -m comment --comment "(?!cali:)[^"]*"//g' "$WORK/as-compiled.txt" >"$WORK/ids-only.txt"
sed -E 's/ -m comment --comment "[^"]*"//g' "$WORK/as-compiled.txt" >"$WORK/no-comments.txt"
perl -e 'my @l = <>; my @start = map { /^-A cali-wl-start (.*)$/ ? $1 : () } @l;
  for (@l) { if (/^-A (cali-[tf]w-\S+) .*-j cali-wl-start$/) { my $c = $1; print "-A $c $_\n" for @start } else { print } }' \
  "$WORK/as-compiled.txt" >"$WORK/per-pod-head.txt"
printf '*filter\n:npa-floor-probe - [0:0]\n-A npa-floor-probe -j ACCEPT\nCOMMIT\n' >"$WORK/probe.txt"

ip netns add "$NS"
ip netns exec "$NS" ipset restore <"$WORK/sets.txt"
printf '%-12s %7s %9s %9s %9s\n' variant rules matches "p50 ms" "max ms"
for variant in as-compiled ids-only no-comments per-pod-head; do
  ip netns exec "$NS" iptables-legacy -F
  ip netns exec "$NS" iptables-legacy -X
  ip netns exec "$NS" iptables-legacy-restore <"$WORK/$variant.txt"
  rules=$(grep -c '^-A' "$WORK/$variant.txt")
  matches=$(grep -o -- ' -m [a-z]*' "$WORK/$variant.txt" | wc -l)
  times=()
  for _ in $(seq "$REPEATS"); do
    start=$(date +%s%N)
    ip netns exec "$NS" iptables-legacy-restore --noflush <"$WORK/probe.txt"
    times+=($(( ($(date +%s%N) - start) / 1000 )))
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v v="$variant" -v r="$rules" -v m="$matches" \
    '{ a[NR] = $1 } END { printf "%-12s %7d %9d %9.1f %9.1f\n", v, r, m, a[int((NR + 1) / 2)] / 1000, a[NR] / 1000 }'
done
