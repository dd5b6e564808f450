#!/usr/bin/env bash
# A real Kubernetes cluster on this machine, from the binaries scripts/k8s.sh builds (issue 36).
#
#   bash scripts/k8s-cluster.sh up [--cni bridge|routed] [--ip-family ipv4|dual]
#        [--proxy-mode iptables|nftables|ipvs] [--workers N] [--k8s VERSION] [--no-agent]
#        [--overlay NAME]
#   bash scripts/k8s-cluster.sh status     # the kubeconfig path (first line), nodes, agents
#   bash scripts/k8s-cluster.sh kubectl ARGS...
#   bash scripts/k8s-cluster.sh import conformance sonobuoy   # suite images, when a run needs them
#   bash scripts/k8s-cluster.sh join [--taint KEY=VALUE:EFFECT]...  # one more worker, now
#        (a node joining a running cluster: its kubelet registers with the taints given,
#        as kubelet's --register-with-taints does; prints the new node's name last)
#   bash scripts/k8s-cluster.sh down       # removes everything up made, also after a failed up
#
# Layout (docs/development/real-cluster.md has the picture):
# - a "fabric" network namespace (npk-fabric) holding the bridge that joins the nodes
#   (10.98.0.0/24, fd00:98::/64), and one veth from the host (npk0, 10.98.0.1) so that
#   kubectl, e2e.test and sonobuoy run on the host; nothing else of the host's network is
#   touched (its iptables, sets and conntrack never);
# - nodes: npk-cp (the control plane: etcd with TLS, kube-apiserver with RBAC, the Node
#   authorizer and kubeadm's admission plugins, controller-manager, scheduler; tainted, so
#   it runs no pods but DaemonSets') and npk-w1..wN; each its own network namespace with its
#   own containerd, kubelet (cgroupfs driver, its own cgroup root) and kube-proxy, all started
#   with nsenter --net (one mount namespace for kubelet and containerd);
# - pods: the CNI reference plugins, `bridge` (cni0, flannel's wiring) or `ptp` (a routed veth
#   with a /32 host route per pod, Calico's wiring), host-local IPAM from the node's podCIDR
#   (controller-manager allocates it), routes between nodes as flannel's host-gw does;
# - the agent installed as an operator installs it: the CRDs, `kubectl apply -k deploy/` (or
#   an overlay), the locally built image (scripts/k8s-images.sh) imported into every node.
# State: target/k8s/cluster/ (certificates, configs, logs: <node>/*.log); sockets under
# /run/npk/. A component that does not come up is named with its log's path.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=lib/pki.sh
source scripts/lib/pki.sh
STATE=${NETPOL_K8S_CLUSTER:-$ROOT/target/k8s/cluster}
RUN=/run/npk
FABRIC=npk-fabric
HOST_IF=npk0

say() { echo "=== k8s-cluster: $*"; }
die() { echo "k8s-cluster: $*" >&2; exit 1; }

cmd=${1:-status}
shift || true

# ---------------------------------------------------------------------------------------------
# down: everything up made, in reverse, tolerating what is not there.
# ---------------------------------------------------------------------------------------------
kill_pidfiles() {
  local f pid
  for f in "$STATE"/*/*.pid "$STATE"/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ] && [ -d "/proc/$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  done
  for _ in $(seq 1 50); do
    local alive=0
    for f in "$STATE"/*/*.pid "$STATE"/*.pid; do
      [ -e "$f" ] || continue
      pid=$(cat "$f" 2>/dev/null || true)
      if [ -n "$pid" ] && [ -d "/proc/$pid" ]; then alive=1; fi
    done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  for f in "$STATE"/*/*.pid "$STATE"/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ] && [ -d "/proc/$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -f "$f"
  done
}

# Processes whose network namespace is one of ours (containerd shims and their containers,
# started by our containerds): only those, found by the namespace they live in.
kill_in_netns() {
  local ns=$1 pid
  [ -e "/run/netns/$ns" ] || return 0
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
}

down() {
  say "down"
  kill_pidfiles
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^npk-' || true); do
    kill_in_netns "$ns"
  done
  # Shims of pods that live in pod namespaces (not ours by name): those whose parent chain
  # leads to a containerd we started are gone with it; what is left are runc containers under
  # our runc roots.
  local root
  for root in "$RUN"/*/runc; do
    [ -d "$root" ] || continue
    local runc_bin
    runc_bin=$(ls "$ROOT"/target/k8s/runc-*/bin/runc 2>/dev/null | head -1)
    [ -n "$runc_bin" ] || break
    for c in $("$runc_bin" --root "$root" list -q 2>/dev/null); do
      "$runc_bin" --root "$root" kill "$c" KILL 2>/dev/null || true
      "$runc_bin" --root "$root" delete -f "$c" 2>/dev/null || true
    done
  done
  # Mounts under our state (volumes, overlay snapshots, netns bind mounts), deepest first.
  local m
  for m in $(awk '{print $2}' /proc/self/mounts | grep -E "^($STATE|$RUN)" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # Pod network namespaces containerd made (under its state dir, unmounted above).
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^npk-' || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$HOST_IF" 2>/dev/null || true
  # The cgroups our kubelets made (cgroup v1: one directory per hierarchy), leaves first.
  local h
  for h in /sys/fs/cgroup/*/; do
    for d in $(find "$h" -depth -type d -name 'npk-*' 2>/dev/null); do
      find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
  done
  if [ -f "$STATE/sysctl.saved" ]; then
    # kubelet sets these machine-wide at start; put back what was there.
    while read -r key value; do sysctl -qw "$key=$value" 2>/dev/null || true; done <"$STATE/sysctl.saved"
  fi
  rm -rf "$RUN"
  # The agent's flow-log hostPath (DirectoryOrCreate): the nodes share this machine's file
  # system, so kubelet made it here; gone again when nothing was written into it.
  rmdir /var/log/netpol-agent/flowlogs /var/log/netpol-agent 2>/dev/null || true
  if [ -d "$STATE" ]; then
    # Keep the logs of the last cluster for reading; drop the rest.
    rm -rf "$STATE.last"
    mkdir -p "$STATE.last"
    find "$STATE" -maxdepth 2 -name '*.log' -exec cp --parents {} "$STATE.last" \; 2>/dev/null || true
    rm -rf "$STATE"
  fi
  say "down: done"
}

if [ "$cmd" = down ]; then
  down
  exit 0
fi

if [ "$cmd" = status ]; then
  [ -f "$STATE/admin.kubeconfig" ] || die "no cluster is up (bash scripts/k8s-cluster.sh up)"
  echo "$STATE/admin.kubeconfig"
  K="$(cat "$STATE/kubectl.path")"
  "$K" --kubeconfig "$STATE/admin.kubeconfig" get nodes -o wide || true
  "$K" --kubeconfig "$STATE/admin.kubeconfig" -n kube-system get pods -o wide 2>/dev/null || true
  cat "$STATE/cell" 2>/dev/null || true
  exit 0
fi

# restart NODE COMPONENT: stops one component (SIGTERM, then SIGKILL after 10 s) and starts
# it again with the same command line, its log appended (scripts/k8s-faults.sh restarts
# kube-apiserver under running agents). stop NODE COMPONENT only stops it.
if [ "$cmd" = restart ] || [ "$cmd" = stop ]; then
  node=${1:?node}; name=${2:?component}
  [ -f "$STATE/$node/$name.cmd" ] || die "no $name on $node"
  pid=$(cat "$STATE/$node/$name.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  if [ "$cmd" = restart ]; then
    mapfile -t words <"$STATE/$node/$name.cmd"
    nsenter --net="/run/netns/$node" -- "${words[@]}" >>"$STATE/$node/$name.log" 2>&1 &
    echo $! >"$STATE/$node/$name.pid"
  fi
  exit 0
fi

# --- images ----------------------------------------------------------------------------------
# The archives scripts/k8s-images.sh made (list.txt: file, then every name it carries). `up`
# imports what every cluster runs (pause, agnhost, the agent); the suite images (the
# conformance image, sonobuoy's) are ~470 MB a node unpacked, so they come in only when a
# run needs them: `bash scripts/k8s-cluster.sh import conformance sonobuoy`.
base_images() { awk '$1 !~ /^(conformance|sonobuoy)-/ { print $1 }' "$IMAGES_DIR/list.txt"; }
image_file() { # PREFIX -> the archive file named by list.txt
  awk -v p="$1" 'index($1, p "-") == 1 || $1 == p || $1 == p ".tar" { print $1; exit }' "$IMAGES_DIR/list.txt"
}
# Every node of $NODES imports each FILE (retried: a node's containerd can refuse an import
# while it is busy); a failure says which, why (ctr's own words) and how much disk is left.
import_images() { # FILE... (into the nodes of $TARGET_NODES)
  local n file first try err
  local -a names
  for n in "${TARGET_NODES[@]}"; do
    for file in "$@"; do
      read -r -a names < <(awk -v f="$file" '$1 == f { $1 = ""; print }' "$IMAGES_DIR/list.txt")
      [ ${#names[@]} -gt 0 ] || die "$file is not in $IMAGES_DIR/list.txt (bash scripts/k8s.sh build)"
      first=${names[0]}
      err="$STATE/$n/import-$file.log"
      for try in 1 2 3; do
        if "$CONTAINERD_BIN/ctr" --address "$RUN/$n/containerd.sock" -n k8s.io images import \
          "$IMAGES_DIR/$file" >"$err" 2>&1; then
          try=0
          break
        fi
        sleep $((try * 2))
      done
      if [ "$try" != 0 ]; then
        echo "k8s-cluster: ctr images import $file on $n, 3 tries; the last said:" >&2
        tail -5 "$err" | sed 's/^/  /' >&2
        echo "k8s-cluster: free on $(df -P "$STATE" | awk 'NR == 2 { print $6 ": " int($4 / 1024) " MiB" }')" >&2
        die "importing $file into $n's containerd failed"
      fi
      for other in "${names[@]:1}"; do
        "$CONTAINERD_BIN/ctr" --address "$RUN/$n/containerd.sock" -n k8s.io \
          images tag --force "$first" "$other" >/dev/null 2>&1
      done
    done
  done
}

# import NAME...: suite images into a running cluster's nodes (NAME: conformance, sonobuoy, or
# any archive list.txt names); a second import of one is a quick no-op for containerd.
if [ "$cmd" = import ]; then
  [ -f "$STATE/admin.kubeconfig" ] || die "no cluster is up"
  eval "$(bash scripts/k8s.sh paths)"
  NODES=()
  for d in "$STATE"/npk-*/; do [ -S "$RUN/$(basename "$d")/containerd.sock" ] && NODES+=("$(basename "$d")"); done
  [ ${#NODES[@]} -gt 0 ] || die "no node's containerd is running"
  TARGET_NODES=("${NODES[@]}")
  files=()
  for name in "$@"; do
    f=$(image_file "$name")
    [ -n "$f" ] || die "no image archive named $name in $IMAGES_DIR/list.txt"
    files+=("$f")
  done
  say "images into every node's containerd: ${files[*]}"
  import_images "${files[@]}"
  exit 0
fi

if [ "$cmd" = kubectl ]; then
  [ -f "$STATE/admin.kubeconfig" ] || die "no cluster is up"
  exec "$(cat "$STATE/kubectl.path")" --kubeconfig "$STATE/admin.kubeconfig" "$@"
fi

[ "$cmd" = up ] || [ "$cmd" = join ] || die "unknown command $cmd: up, join, status, kubectl, import, restart, stop, down"

# ---------------------------------------------------------------------------------------------
# up, and join (the per-node part of up, for one more worker of the cluster that is up)
# ---------------------------------------------------------------------------------------------
JOIN=0
[ "$cmd" = join ] && JOIN=1
JOIN_TAINTS=()
CNI=bridge
FAMILY=ipv4
PROXY=iptables
WORKERS=2
# The default release, named (k8s.sh paths would take a leftover cluster's otherwise).
K8S_ARGS=(--k8s "$(sed -n 's/^K8S_DEFAULT=//p' e2e/k8s/versions.env)")
AGENT=1
OVERLAY=
while [ $# -gt 0 ]; do
  case "$1" in
    --cni) CNI=$2; shift 2 ;;
    --ip-family) FAMILY=$2; shift 2 ;;
    --proxy-mode) PROXY=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --k8s) K8S_ARGS=(--k8s "$2"); shift 2 ;;
    --no-agent) AGENT=0; shift ;;
    --overlay) OVERLAY=$2; shift 2 ;;
    --taint) [ "$JOIN" = 1 ] || die "--taint is for join"; JOIN_TAINTS+=("$2"); shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
if [ "$JOIN" = 1 ]; then
  [ -f "$STATE/admin.kubeconfig" ] && [ -f "$STATE/nodes" ] || die "no cluster is up to join (bash scripts/k8s-cluster.sh up)"
  # The cell of the cluster that is up: its CNI, family, proxy mode and release.
  read -r CNI FAMILY PROXY k8s_v < <(sed -n 's/^cni=\([^ ]*\) ip-family=\([^ ]*\) proxy-mode=\([^ ]*\) kubernetes=v\([^ ]*\).*/\1 \2 \3 \4/p' "$STATE/cell")
  [ -n "$k8s_v" ] || die "$STATE/cell is not readable"
  K8S_ARGS=(--k8s "$k8s_v")
fi
case "$CNI" in bridge|routed) ;; *) die "--cni bridge|routed, not $CNI" ;; esac
case "$FAMILY" in ipv4|dual) ;; *) die "--ip-family ipv4|dual, not $FAMILY" ;; esac
case "$PROXY" in iptables|nftables) ;;
  ipvs)
    grep -q ip_vs /proc/net/ip_vs 2>/dev/null || [ -e /proc/net/ip_vs ] \
      || die "--proxy-mode ipvs needs a kernel with IP_VS; this one has none: run the cluster in a VM (scripts/k8s-vm.sh)" ;;
  *) die "--proxy-mode iptables|nftables|ipvs, not $PROXY" ;;
esac
[ "$(id -u)" = 0 ] || die "run as root"
if [ "$JOIN" = 0 ] && { [ -e "$STATE/admin.kubeconfig" ] || ip netns list 2>/dev/null | grep -q '^npk-'; }; then
  # The names, the fabric's addresses and /run/npk are the machine's, so one cluster at a
  # time; name whose it is (another checkout's, or a run that ended without its `down`).
  owner=$(cat "$RUN/state" 2>/dev/null || echo "$STATE")
  die "a cluster is up already (network namespaces: $(ip netns list 2>/dev/null | awk '/^npk-/ { printf "%s ", $1 }')state: $owner); take it down first: NETPOL_K8S_CLUSTER=$owner bash scripts/k8s-cluster.sh down"
fi

eval "$(bash scripts/k8s.sh paths "${K8S_ARGS[@]}")"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  [ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b is missing: bash scripts/k8s.sh build first"
done
[ -x "$ETCD_BIN/etcd" ] || die "etcd is missing: bash scripts/k8s.sh build first"
[ -x "$CONTAINERD_BIN/containerd" ] || die "containerd is missing: bash scripts/k8s.sh build first"
[ -f "$IMAGES_DIR/list.txt" ] || die "no images: bash scripts/k8s.sh build first"
need=()
[ -x "$RUNC_BIN/runc" ] || die "runc is missing: bash scripts/k8s.sh build first"
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v openssl >/dev/null || need+=(openssl)
command -v conntrack >/dev/null || need+=(conntrack)
{ [ "$PROXY" != nftables ] || command -v nft >/dev/null; } || need+=(nftables)
command -v nsenter >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }
fi

if [ "$JOIN" = 0 ]; then
  # A failed up leaves nothing behind (NETPOL_K8S_KEEP_FAILED=1 keeps it for a look; `down`
  # still removes it).
  trap 'status=$?; if [ $status -ne 0 ]; then if [ "${NETPOL_K8S_KEEP_FAILED:-0}" = 1 ]; then echo "k8s-cluster: up failed; kept as it is (NETPOL_K8S_KEEP_FAILED); bash scripts/k8s-cluster.sh down removes it" >&2; else echo "k8s-cluster: up failed; logs: $STATE/<node>/*.log (kept in $STATE.last); cleaning up" >&2; down >/dev/null 2>&1 || true; fi; fi' EXIT

  rm -rf "$STATE" "$RUN"
  mkdir -p "$STATE" "$RUN"
  echo "$STATE" >"$RUN/state"
  echo "$K8S_BIN/kubectl" >"$STATE/kubectl.path"
  echo "cni=$CNI ip-family=$FAMILY proxy-mode=$PROXY kubernetes=v$K8S_VERSION workers=$WORKERS" >"$STATE/cell"
  NODES=(npk-cp)
  for i in $(seq 1 "$WORKERS"); do NODES+=("npk-w$i"); done
  printf '%s\n' "${NODES[@]}" >"$STATE/nodes"
  NEW=("${NODES[@]}")
else
  # join: the nodes so far (in the order their addresses were given), and the next worker.
  trap 'status=$?; [ $status -eq 0 ] || echo "k8s-cluster: join failed; logs: $STATE/<node>/*.log; bash scripts/k8s-cluster.sh down removes the whole cluster" >&2' EXIT
  mapfile -t NODES <"$STATE/nodes"
  NEW=("npk-w${#NODES[@]}")
  NODES+=("${NEW[@]}")
  printf '%s\n' "${NODES[@]}" >"$STATE/nodes"
fi
KUBECTL="$K8S_BIN/kubectl --kubeconfig $STATE/admin.kubeconfig"
node_index() { local i; for i in "${!NODES[@]}"; do if [ "${NODES[$i]}" = "$1" ]; then echo "$i"; return 0; fi; done; return 1; }
node_ip() { echo "10.98.0.$((10 + $(node_index "$1")))"; }
node_ip6() { echo "fd00:98::$((10 + $(node_index "$1")))"; }
CP_IP=$(node_ip npk-cp)
SERVICE_CIDR=10.96.0.0/16
CLUSTER_CIDR=10.244.0.0/16
API_SERVICE_IP=10.96.0.1
CIDR_MASK6=()
if [ "$FAMILY" = dual ]; then
  SERVICE_CIDR=10.96.0.0/16,fd00:10:96::/112
  CLUSTER_CIDR=10.244.0.0/16,fd00:10:244::/56
  CIDR_MASK6=(--node-cidr-mask-size-ipv6 64)
fi

# Whether this machine lets root lower OOM scores (CAP_SYS_RESOURCE, bit 24 of CapEff).
RESTRICT_OOM=false
caps=$(awk '/^CapEff/ { print $2 }' /proc/self/status)
if [ $(( 0x$caps >> 24 & 1 )) = 0 ]; then RESTRICT_OOM=true; fi

# kubelet sets these machine-wide; down puts them back.
if [ "$JOIN" = 0 ]; then
  for key in vm.overcommit_memory kernel.panic kernel.panic_on_oops; do
    echo "$key $(sysctl -n "$key")" >>"$STATE/sysctl.saved"
  done
fi

# --- certificates ----------------------------------------------------------------------------
PKI=$STATE/pki
mkdir -p "$PKI"
say "certificates"
if [ "$JOIN" = 0 ]; then
  pki_ca netpol-k8s-ca 30
fi
cert() { pki_cert 30 "$@"; } # NAME CN ORG SANS USAGE (scripts/lib/pki.sh)
if [ "$JOIN" = 0 ]; then
  api_sans="DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:$CP_IP,IP:$API_SERVICE_IP,IP:127.0.0.1,IP:10.98.0.1"
  [ "$FAMILY" = dual ] && api_sans="$api_sans,IP:fd00:10:96::1,IP:$(node_ip6 npk-cp)"
  cert apiserver kube-apiserver "" "$api_sans" server
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" client
  cert apiserver-etcd-client kube-apiserver-etcd-client "" "" client
  cert etcd etcd "" "DNS:localhost,IP:127.0.0.1" both
  cert admin kubernetes-admin system:masters "" client
  cert controller-manager system:kube-controller-manager "" "" client
  cert scheduler system:kube-scheduler "" "" client
  cert kube-proxy system:kube-proxy "" "" client
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
fi
for n in "${NEW[@]}"; do cert "kubelet-$n" "system:node:$n" system:nodes "" client; done

kubeconfig() { pki_kubeconfig "$1" npk "$2" "$3"; } # FILE CERTNAME SERVER
if [ "$JOIN" = 0 ]; then
  kubeconfig "$STATE/admin.kubeconfig" admin "https://$CP_IP:6443"
  kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager "https://127.0.0.1:6443"
  kubeconfig "$STATE/scheduler.kubeconfig" scheduler "https://127.0.0.1:6443"
  kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy "https://$CP_IP:6443"
fi
for n in "${NEW[@]}"; do kubeconfig "$STATE/kubelet-$n.kubeconfig" "kubelet-$n" "https://$CP_IP:6443"; done

# --- network ---------------------------------------------------------------------------------
say "network: ${#NEW[@]} node(s) ($FAMILY): ${NEW[*]}"
if [ "$JOIN" = 0 ]; then
  ip netns add "$FABRIC"
  ip netns exec "$FABRIC" sh -c 'ip link set lo up && ip link add br0 type bridge && ip link set br0 up && ip addr add 10.98.0.254/24 dev br0 && sysctl -qw net.ipv6.conf.all.disable_ipv6=0 && ip -6 addr add fd00:98::fe/64 dev br0 nodad'
  ip link add "$HOST_IF" type veth peer name host netns "$FABRIC"
  ip netns exec "$FABRIC" sh -c 'ip link set host master br0 && ip link set host up'
  ip addr add 10.98.0.1/24 dev "$HOST_IF"
  ip -6 addr add fd00:98::1/64 dev "$HOST_IF" nodad 2>/dev/null || true
  ip link set "$HOST_IF" up
fi
for n in "${NEW[@]}"; do
  ip netns add "$n"
  ip link add "f-$n" type veth peer name eth0 netns "$n"
  ip link set "f-$n" netns "$FABRIC"
  ip netns exec "$FABRIC" sh -c "ip link set f-$n master br0 && ip link set f-$n up"
  ip netns exec "$n" sh -c "ip link set lo up && ip link set eth0 up && ip addr add $(node_ip "$n")/24 dev eth0 \
    && ip route add default via 10.98.0.254 \
    && sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
       net.ipv6.conf.all.forwarding=1 net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
    && ip -6 addr add $(node_ip6 "$n")/64 dev eth0 nodad && ip -6 route add default via fd00:98::fe"
  if [ -e "/proc/sys/net/bridge/bridge-nf-call-iptables" ] || ip netns exec "$n" test -e /proc/sys/net/bridge/bridge-nf-call-iptables; then
    ip netns exec "$n" sh -c 'echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables; echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables' 2>/dev/null || true
  fi
  mkdir -p "$STATE/$n" "$RUN/$n"
done

# Starts a long-running process in a node's network namespace (the host's mount namespace),
# its output to <node>/<name>.log, its pid to <node>/<name>.pid.
start() { # NODE NAME CMD...
  local node=$1 name=$2
  shift 2
  # The command line, one word a line, for `restart`.
  printf '%s\n' "$@" >"$STATE/$node/$name.cmd"
  nsenter --net="/run/netns/$node" -- "$@" >>"$STATE/$node/$name.log" 2>&1 &
  echo $! >"$STATE/$node/$name.pid"
}
# Waits until CMD succeeds (every 0.5 s, up to SECONDS_MAX), else names the component's log.
wait_for() { # SECONDS_MAX NODE NAME CMD...
  local max=$1 node=$2 name=$3
  shift 3
  local deadline=$((SECONDS + max))
  until "$@" >/dev/null 2>&1; do
    if [ -f "$STATE/$node/$name.pid" ] && ! kill -0 "$(cat "$STATE/$node/$name.pid")" 2>/dev/null; then
      tail -15 "$STATE/$node/$name.log" >&2 || true
      die "$name on $node exited; its log: $STATE/$node/$name.log"
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -15 "$STATE/$node/$name.log" >&2 || true
      die "$name on $node did not come up within $max s; its log: $STATE/$node/$name.log"
    fi
    sleep 0.5
  done
}

# --- control plane ---------------------------------------------------------------------------
if [ "$JOIN" = 0 ]; then
say "control plane on npk-cp: etcd, kube-apiserver, controller-manager, scheduler"
start npk-cp etcd "$ETCD_BIN/etcd" --name npk-cp --data-dir "$STATE/npk-cp/etcd" \
  --listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster npk-cp=http://127.0.0.1:2380 \
  --cert-file "$PKI/etcd.crt" --key-file "$PKI/etcd.key" --client-cert-auth \
  --trusted-ca-file "$PKI/ca.crt" --listen-metrics-urls http://127.0.0.1:2381 \
  --snapshot-count 10000 --quota-backend-bytes 4294967296
wait_for 60 npk-cp etcd ip netns exec npk-cp curl -sf http://127.0.0.1:2381/health

start npk-cp kube-apiserver "$K8S_BIN/kube-apiserver" \
  --advertise-address "$CP_IP" --bind-address 0.0.0.0 --secure-port 6443 \
  --etcd-servers https://127.0.0.1:2379 --etcd-cafile "$PKI/ca.crt" \
  --etcd-certfile "$PKI/apiserver-etcd-client.crt" --etcd-keyfile "$PKI/apiserver-etcd-client.key" \
  --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types InternalIP,Hostname \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --allow-privileged=true --service-cluster-ip-range "$SERVICE_CIDR" \
  --profiling=false --audit-log-maxage 0
wait_for 120 npk-cp kube-apiserver $KUBECTL get --raw /readyz

start npk-cp kube-controller-manager "$K8S_BIN/kube-controller-manager" \
  --kubeconfig "$STATE/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --use-service-account-credentials=true --controllers '*,bootstrapsigner,tokencleaner' \
  --allocate-node-cidrs=true --cluster-cidr "$CLUSTER_CIDR" --service-cluster-ip-range "$SERVICE_CIDR" \
  --node-cidr-mask-size-ipv4 24 "${CIDR_MASK6[@]}"
start npk-cp kube-scheduler "$K8S_BIN/kube-scheduler" \
  --kubeconfig "$STATE/scheduler.kubeconfig" \
  --authentication-kubeconfig "$STATE/scheduler.kubeconfig" \
  --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false
wait_for 60 npk-cp kube-controller-manager ip netns exec npk-cp curl -skf https://127.0.0.1:10257/healthz
wait_for 60 npk-cp kube-scheduler ip netns exec npk-cp curl -skf https://127.0.0.1:10259/healthz
fi

# --- nodes: containerd, kubelet, kube-proxy --------------------------------------------------
containerd_config() { # NODE
  local n=$1
  cat >"$STATE/$n/containerd.toml" <<EOF
version = 3
root = "$STATE/$n/containerd"
state = "$RUN/$n/containerd"
[grpc]
  address = "$RUN/$n/containerd.sock"
[ttrpc]
  address = "$RUN/$n/containerd.sock.ttrpc"
[debug]
  address = "$RUN/$n/containerd-debug.sock"
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:$PAUSE_VERSION'
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    # This machine's root lacks CAP_SYS_RESOURCE, so no process may lower its OOM score
    # (runc init failed with "failed to update /proc/self/oom_score_adj: Permission denied"
    # for every pod); containers keep at least containerd's own score instead.
    restrict_oom_score_adj = $RESTRICT_OOM
    enable_unprivileged_ports = false
    enable_unprivileged_icmp = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$RUNC_BIN/runc'
          Root = '$RUN/$n/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni']
      conf_dir = '$STATE/$n/cni'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.internal.v1.opt']
    path = '$STATE/$n/containerd-opt'
EOF
}

kubelet_config() { # NODE
  local n=$1 ip ips
  ip=$(node_ip "$n")
  ips=$ip
  [ "$FAMILY" = dual ] && ips="$ip,$(node_ip6 "$n")"
  : >"$STATE/$n/resolv.conf"
  echo "nameserver 10.96.0.10" >"$STATE/$n/resolv.conf"
  cat >"$STATE/$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupRoot: /$n
cgroupsPerQOS: true
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$RUN/$n/containerd.sock
imageServiceEndpoint: unix://$RUN/$n/containerd.sock
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
resolvConf: $STATE/$n/resolv.conf
podLogsDir: $STATE/$n/pod-logs
imageGCHighThresholdPercent: 100
imageMinimumGCAge: 24h
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
evictionPressureTransitionPeriod: 1s
localStorageCapacityIsolation: false
protectKernelDefaults: false
maxPods: 110
serializeImagePulls: false
enforceNodeAllocatable: [pods]
EOF
  {
    echo "$ips"
  } >"$STATE/$n/node-ips"
}

kube_proxy_config() { # NODE
  local n=$1
  cat >"$STATE/$n/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
hostnameOverride: $n
bindAddress: 0.0.0.0
clusterCIDR: $CLUSTER_CIDR
mode: $PROXY
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 0.0.0.0:10256
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

for n in "${NEW[@]}"; do
  say "node $n: containerd, kubelet, kube-proxy"
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] || continue
    case "$h" in */unified/) continue ;; esac
    mkdir -p "$h$n" 2>/dev/null || true
    if [ -f "${h}cpuset.cpus" ]; then
      cat "${h}cpuset.cpus" >"$h$n/cpuset.cpus" 2>/dev/null || true
      cat "${h}cpuset.mems" >"$h$n/cpuset.mems" 2>/dev/null || true
    fi
  done
  mkdir -p "$STATE/$n/cni" "$STATE/$n/pod-logs" "$RUN/$n/runc"
  containerd_config "$n"
  start "$n" containerd env "PATH=$CONTAINERD_BIN:$PATH" "$CONTAINERD_BIN/containerd" --config "$STATE/$n/containerd.toml"
done
for n in "${NEW[@]}"; do
  wait_for 60 "$n" containerd "$CONTAINERD_BIN/ctr" --address "$RUN/$n/containerd.sock" version
done

say "images into every node's containerd: $(base_images | tr '\n' ' ')"
TARGET_NODES=("${NEW[@]}")
# shellcheck disable=SC2046
import_images $(base_images) &
import_pid=$!
# A joining node gets the DaemonSets' pods at once: with their images not imported yet,
# kubelet's failed pulls would back off for tens of seconds (there is no registry).
if [ "$JOIN" = 1 ]; then
  wait "$import_pid" || die "importing the images failed"
  import_pid=
fi

for n in "${NEW[@]}"; do
  kubelet_config "$n"
  kube_proxy_config "$n"
  extra=()
  [ "$n" = npk-cp ] && extra+=(--register-with-taints node-role.kubernetes.io/control-plane:NoSchedule)
  [ ${#JOIN_TAINTS[@]} -gt 0 ] && extra+=(--register-with-taints "$(IFS=,; echo "${JOIN_TAINTS[*]}")")
  start "$n" kubelet "$K8S_BIN/kubelet" --config "$STATE/$n/kubelet.yaml" \
    --kubeconfig "$STATE/kubelet-$n.kubeconfig" --hostname-override "$n" \
    --node-ip "$(cat "$STATE/$n/node-ips")" --root-dir "$STATE/$n/kubelet" \
    --cert-dir "$STATE/$n/kubelet-pki" --v 1 "${extra[@]}"
  # Every kubelet binds /var/lib/kubelet/device-plugins/kubelet.sock, a fixed path outside
  # --root-dir: started at once, two can remove and bind it together and one exits with
  # "address already in use" (seen once, 2026-11-29). The next starts once this one holds it
  # (at most 30 s; a kubelet that never binds fails below, named by its log).
  for _ in $(seq 1 60); do
    [ -n "$(find /var/lib/kubelet/device-plugins/kubelet.sock -newer "$STATE/$n/kubelet.cmd" 2>/dev/null)" ] && break
    sleep 0.5
  done
  start "$n" kube-proxy "$K8S_BIN/kube-proxy" --config "$STATE/$n/kube-proxy.yaml" --v 1
done
[ -z "$import_pid" ] || wait "$import_pid" || die "importing the images failed"

for n in "${NEW[@]}"; do
  wait_for 120 "$n" kubelet $KUBECTL get node "$n"
done
[ "$JOIN" = 1 ] || $KUBECTL label node npk-cp node-role.kubernetes.io/control-plane= --overwrite >/dev/null

# --- pod network: CNI config from each node's podCIDRs, routes between nodes ------------------
say "pod network: CNI $CNI"
pod_cidrs() { $KUBECTL get node "$1" -o jsonpath='{.spec.podCIDRs[*]}'; }
for n in "${NEW[@]}"; do
  wait_for 60 "$n" kube-controller-manager test -n "$(pod_cidrs "$n")"
done
for n in "${NEW[@]}"; do
  cidrs=$(pod_cidrs "$n")
  ranges=""
  routes=""
  for c in $cidrs; do
    ranges="$ranges${ranges:+,}[{\"subnet\":\"$c\"}]"
    case "$c" in *:*) routes="$routes${routes:+,}{\"dst\":\"::/0\"}" ;; *) routes="$routes${routes:+,}{\"dst\":\"0.0.0.0/0\"}" ;; esac
  done
  case "$CNI" in
    bridge)
      plugin="{\"type\":\"bridge\",\"bridge\":\"cni0\",\"isGateway\":true,\"ipMasq\":false,\"hairpinMode\":true,\"ipam\":{\"type\":\"host-local\",\"ranges\":[$ranges],\"routes\":[$routes],\"dataDir\":\"$STATE/$n/ipam\"}}" ;;
    routed)
      plugin="{\"type\":\"ptp\",\"ipMasq\":false,\"mtu\":1500,\"ipam\":{\"type\":\"host-local\",\"ranges\":[$ranges],\"routes\":[$routes],\"dataDir\":\"$STATE/$n/ipam\"}}" ;;
  esac
  cat >"$STATE/$n/cni/10-npk.conflist" <<EOF
{"cniVersion":"1.0.0","name":"npk","plugins":[$plugin,{"type":"portmap","capabilities":{"portMappings":true}}]}
EOF
  # Routes to the other nodes' pods (flannel's host-gw).
  for m in "${NODES[@]}"; do
    [ "$m" = "$n" ] && continue
    for c in $(pod_cidrs "$m"); do
      case "$c" in
        *:*) ip netns exec "$n" ip -6 route replace "$c" via "$(node_ip6 "$m")" ;;
        *) ip netns exec "$n" ip route replace "$c" via "$(node_ip "$m")" ;;
      esac
    done
    # A joined node's pods, from the nodes that were there before it.
    if [ "$JOIN" = 1 ]; then
      for c in $cidrs; do
        case "$c" in
          *:*) ip netns exec "$m" ip -6 route replace "$c" via "$(node_ip6 "$n")" ;;
          *) ip netns exec "$m" ip route replace "$c" via "$(node_ip "$n")" ;;
        esac
      done
    fi
  done
done
for n in "${NEW[@]}"; do
  wait_for 120 "$n" kubelet sh -c "$KUBECTL get node $n -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
done
say "nodes ready: $($KUBECTL get nodes --no-headers | awk '{print $1"("$2")"}' | tr '\n' ' ')"

# --- the agent, as an operator installs it ---------------------------------------------------
if [ "$JOIN" = 1 ]; then
  trap - EXIT
  say "joined: ${NEW[*]} (ready; the DaemonSets place their pods there now)"
  echo "${NEW[0]}"
  exit 0
fi
if [ "$AGENT" = 1 ]; then
  bash scripts/k8s-agent.sh install ${OVERLAY:+--overlay "$OVERLAY"}
fi
trap - EXIT
say "up: $(cat "$STATE/cell"); kubeconfig: $STATE/admin.kubeconfig"
