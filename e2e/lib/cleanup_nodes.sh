# Shared by the conformance runners on a real cluster (e2e/sonobuoy/run.sh,
# e2e/network-policy-api/run.sh), sourced after they set: log (a function), ns (the agent's
# namespace), out (the results directory), NETPOL_AGENT_IMAGE, backend, ipv6.

cleanup_nodes() {
    # SIGTERM leaves the rules in place by design; remove them from every node with a
    # one-off DaemonSet running `netpol-agent cleanup`.
    log "removing netpol-agent's rules and sets from every node"
    kubectl apply -f - <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: netpol-agent-cleanup, namespace: $ns}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: netpol-agent-cleanup}}
  template:
    metadata: {labels: {app.kubernetes.io/name: netpol-agent-cleanup}}
    spec:
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      containers:
        - name: cleanup
          image: $NETPOL_AGENT_IMAGE
          command: [sh, -c, 'netpol-agent cleanup && echo NETPOL-CLEANUP-DONE; sleep 86400']
          env:
            - {name: FELIX_IPTABLESBACKEND, value: "$backend"}
            - {name: FELIX_IPV6SUPPORT, value: "$ipv6"}
          securityContext:
            capabilities: {drop: [ALL], add: [NET_ADMIN, NET_RAW]}
          volumeMounts: [{name: xtables-lock, mountPath: /run/xtables.lock}]
      volumes:
        - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
YAML
    kubectl -n "$ns" rollout status ds/netpol-agent-cleanup --timeout=5m || true
    local pods done_count total
    for _ in $(seq 60); do
        pods=$(kubectl -n "$ns" get pods -l app.kubernetes.io/name=netpol-agent-cleanup -o name)
        total=$(wc -w <<<"$pods")
        done_count=0
        for p in $pods; do
            if kubectl -n "$ns" logs "$p" 2>/dev/null | grep -q NETPOL-CLEANUP-DONE; then
                done_count=$((done_count + 1))
            fi
        done
        [[ "$total" -gt 0 && "$done_count" -eq "$total" ]] && break
        sleep 5
    done
    log "cleanup done on $done_count of $total nodes"
    kubectl -n "$ns" logs -l app.kubernetes.io/name=netpol-agent-cleanup --tail=-1 >"$out/cleanup.log" 2>&1 || true
    kubectl -n "$ns" delete ds/netpol-agent-cleanup --wait=true || true
}
