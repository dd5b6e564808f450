#!/usr/bin/env bash
# Measures candidate iptables/ipset layouts for many NetworkPolicies selecting one pod
# (docs/development/policy-layout.md): the new-connection rate (TCP connect/accept/reset-close)
# through a node namespace whose FORWARD chain holds hand-written rules, with no agent. Each
# layout is built in fresh namespaces (client, node, server) that are removed on exit, failure
# included; the host's own tables are never touched (every iptables/ipset call runs inside the
# node namespace).
#
#   scripts/policy-layout.sh [POLICIES=1000] [SECS=5] [ROUNDS=3]     (root)
#
# Layouts (the allowing policy is always the last one, as in benches/conn_rate.rs):
#   base      conntrack ESTABLISHED accept and one jump to the pod's chain, which accepts
#   chains    felix's layout, as the agent renders it: per policy a jump to its chain, a
#             set-match rule that marks, a return-if-marked; the 999 other peers' sets EMPTY
#   chains-m  the same with the other peers' sets holding 4 addresses each (none the client)
#   accept-m  per policy a jump to its chain whose rule ACCEPTs (no mark, no return check),
#             other peers' sets with members
#   inline    one rule per policy rule straight in the pod's chain (set match, port, ACCEPT):
#             no jump, no mark, no return; per-rule counters kept; other peers' sets EMPTY
#   inline-m  the same with the other peers' sets holding 4 addresses each
#   skip      the chain layout with jumps to policies whose peer sets are empty left out
#   union     one hash:net,port set per (pod, direction) holding the union of every policy's
#             (peer address, port): one set match, then the per-rule chains only for counting
#             are NOT walked (1 rule per new connection)
#   union-m   union with the other peers' members added (4000 more entries)
#   union-ex  union-m plus an ipBlock with an except, as a nomatch entry
set -euo pipefail
N=${1:-1000}
SECS=${2:-5}
ROUNDS=${3:-3}
TAG=npl$$
WORK=$(mktemp -d)
cleanup() {
    for ns in c n s; do ip netns del "$TAG-$ns" 2>/dev/null || true; done
    # The server of a layout that failed half-way (measure runs in a subshell).
    if [ -s "$WORK/server.pid" ]; then kill "$(cat "$WORK/server.pid")" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/cr.c" <<'EOF'
/* server: accept and close; client: connect, read to EOF, close with a reset, for SECS. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(80) };
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    int one = 1;
    if (!strcmp(argv[1], "server")) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 4096)) { perror("listen"); return 1; }
        for (;;) { int c = accept(l, 0, 0); if (c >= 0) close(c); }
    }
    double secs = atof(argv[3]), end = now() + secs;
    long ok = 0, bad = 0;
    struct linger lg = { 1, 0 };
    char buf[16];
    while (now() < end) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&a, sizeof a) == 0 && read(s, buf, sizeof buf) == 0) ok++; else bad++;
        setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(s);
    }
    printf("%.0f %ld\n", ok / secs, bad);
    return 0;
}
EOF
gcc -O2 -o "$WORK/cr" "$WORK/cr.c"

inn() { ip netns exec "$TAG-n" "$@"; }

topo() {
    for ns in c n s; do ip netns add "$TAG-$ns"; ip -n "$TAG-$ns" link set lo up; done
    ip link add c0 netns "$TAG-c" type veth peer name vc netns "$TAG-n"
    ip link add s0 netns "$TAG-s" type veth peer name vs netns "$TAG-n"
    ip -n "$TAG-c" addr add 10.79.0.2/24 dev c0
    ip -n "$TAG-s" addr add 10.79.1.2/24 dev s0
    ip -n "$TAG-n" addr add 10.79.0.1/24 dev vc
    ip -n "$TAG-n" addr add 10.79.1.1/24 dev vs
    for l in c/c0 s/s0 n/vc n/vs; do ip -n "$TAG-${l%/*}" link set "${l#*/}" up; done
    ip -n "$TAG-c" route add default via 10.79.0.1
    ip -n "$TAG-s" route add default via 10.79.1.1
    inn sysctl -qw net.ipv4.ip_forward=1
}

# The rules of one layout, as iptables-restore input (plus ipset restore input).
layout() {
    local kind=$1 members=0 i
    case $kind in *-m | *-ex) members=1 ;; esac
    : >"$WORK/sets"
    {
        echo "*filter"
        echo ":wl - [0:0]"
        echo "-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        echo "-A FORWARD -o vs -j wl"
        case $kind in
        base) echo "-A wl -j ACCEPT" ;;
        accept-m)
            for i in $(seq 1 "$N"); do
                local set=peer$i
                echo "create $set hash:net -exist" >>"$WORK/sets"
                if [ "$i" = "$N" ]; then
                    echo "add $set 10.79.0.2" >>"$WORK/sets"
                else
                    for m in 1 2 3 4; do echo "add $set 10.$((80 + i / 250)).$((i % 250)).$m" >>"$WORK/sets"; done
                fi
                echo ":pi$i - [0:0]"
                echo "-A pi$i -p tcp -m set --match-set $set src -m multiport --dports 80 -j ACCEPT"
                echo "-A wl -j pi$i"
            done
            echo "-A wl -j DROP"
            ;;
        inline | inline-m)
            for i in $(seq 1 "$N"); do
                local set=peer$i
                echo "create $set hash:net -exist" >>"$WORK/sets"
                if [ "$i" = "$N" ]; then
                    echo "add $set 10.79.0.2" >>"$WORK/sets"
                elif [ $members = 1 ]; then
                    for m in 1 2 3 4; do echo "add $set 10.$((80 + i / 250)).$((i % 250)).$m" >>"$WORK/sets"; done
                fi
                echo "-A wl -p tcp -m set --match-set $set src -m multiport --dports 80 -j ACCEPT"
            done
            echo "-A wl -j DROP"
            ;;
        chains | chains-m | skip)
            echo "-A wl -j MARK --set-xmark 0x0/0x10000"
            for i in $(seq 1 "$N"); do
                local set=peer$i
                if [ "$i" = "$N" ]; then
                    echo "create $set hash:net -exist" >>"$WORK/sets"
                    echo "add $set 10.79.0.2" >>"$WORK/sets"
                else
                    echo "create $set hash:net -exist" >>"$WORK/sets"
                    if [ $members = 1 ]; then
                        for m in 1 2 3 4; do echo "add $set 10.$((80 + i / 250)).$((i % 250)).$m" >>"$WORK/sets"; done
                    fi
                fi
                if [ "$kind" = skip ] && [ "$i" != "$N" ]; then continue; fi
                echo ":pi$i - [0:0]"
                echo "-A pi$i -p tcp -m set --match-set $set src -m multiport --dports 80 -j MARK --set-xmark 0x10000/0x10000"
                echo "-A pi$i -m mark --mark 0x10000/0x10000 -j RETURN"
                echo "-A wl -j pi$i"
                echo "-A wl -m mark --mark 0x10000/0x10000 -j RETURN"
            done
            echo "-A wl -j DROP"
            ;;
        union | union-m | union-ex)
            echo "create u-wl hash:net,port family inet maxelem 1048576 -exist" >>"$WORK/sets"
            for i in $(seq 1 "$N"); do
                if [ "$i" = "$N" ]; then
                    echo "add u-wl 10.79.0.2,tcp:80" >>"$WORK/sets"
                elif [ $members = 1 ]; then
                    for m in 1 2 3 4; do echo "add u-wl 10.$((80 + i / 250)).$((i % 250)).$m,tcp:80" >>"$WORK/sets"; done
                fi
            done
            if [ "$kind" = union-ex ]; then
                # ipBlock 10.64.0.0/10 except 10.79.0.0/24 on port 80: the except as nomatch,
                # which hash:net's longest-prefix match puts before the wider block.
                echo "add u-wl 10.64.0.0/10,tcp:80" >>"$WORK/sets"
                echo "add u-wl 10.79.0.0/26,tcp:80 nomatch" >>"$WORK/sets"
                echo "add u-wl 10.79.0.2,tcp:80" >>"$WORK/sets"
            fi
            echo "-A wl -m set --match-set u-wl src,dst -j ACCEPT"
            echo "-A wl -j DROP"
            ;;
        esac
        echo "COMMIT"
    } >"$WORK/rules"
}

measure() {
    local kind=$1
    topo
    layout "$kind"
    inn ipset restore <"$WORK/sets"
    inn iptables-legacy-restore <"$WORK/rules"
    ip netns exec "$TAG-s" "$WORK/cr" server 10.79.1.2 &
    SERVER_PID=$!
    echo "$SERVER_PID" >"$WORK/server.pid"
    sleep 0.3
    ip netns exec "$TAG-c" "$WORK/cr" client 10.79.1.2 0.3 >/dev/null
    local out
    out=$(ip netns exec "$TAG-c" "$WORK/cr" client 10.79.1.2 "$SECS")
    kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
    : >"$WORK/server.pid"
    local rules
    rules=$(inn iptables-legacy-save -t filter | grep -c '^-A' || true)
    for ns in c n s; do ip netns del "$TAG-$ns"; done
    echo "$out $rules"
}

LAYOUTS=(base chains chains-m accept-m inline inline-m skip union union-m union-ex)
declare -A RATES
echo "policy layouts: $N policies, $SECS s, $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    for k in "${LAYOUTS[@]}"; do
        read -r rate failed rules < <(measure "$k")
        RATES[$k]+="$rate "
        printf 'round %d %-9s %8s conn/s  failed %s  rules %s\n' "$r" "$k" "$rate" "$failed" "$rules"
    done
done
echo "| layout | conn/s (median) | ratio to base (median of per-round ratios) |"
echo "|---|---|---|"
for k in "${LAYOUTS[@]}"; do
    python3 - "$k" "${RATES[base]}" "${RATES[$k]}" <<'EOF'
import statistics, sys
k, base, rates = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
print(f"| {k} | {statistics.median(rates):.0f} | {statistics.median(r / b for r, b in zip(rates, base)):.3f} |")
EOF
done
