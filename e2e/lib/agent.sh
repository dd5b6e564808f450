# Shared by the conformance runners for a cluster of the user's (e2e/sonobuoy/run.sh,
# e2e/network-policy-api/run.sh): installing the agent as docs/install.md says and removing
# it as docs/operations/uninstall.md says, with the shipped manifests, so these runs test what
# users apply. Sourced after the runner sets: log (a function), repo, ns (kube-system) and out
# (the results directory). Settings (environment):
#   NETPOL_OVERLAY       a directory of deploy/overlays/ or your own kustomization (default:
#                        deploy/, FELIX_INTERFACENAMESCHEME=auto)
#   NETPOL_AGENT_IMAGE   the image, when not the release's of deploy/image/
#   FELIX_*              set on the DaemonSet when given (FELIX_INTERFACENAMESCHEME,
#                        FELIX_INTERFACEPREFIX, FELIX_IPTABLESBACKEND, FELIX_IPV6SUPPORT, ...)

deploy_agent() {
    local target="${NETPOL_OVERLAY:-$repo/deploy}" env_args=() v
    log "deploying netpol-agent: kubectl apply -k $target${NETPOL_AGENT_IMAGE:+, image $NETPOL_AGENT_IMAGE}"
    kubectl apply -k "$target"
    if [[ -n "${NETPOL_AGENT_IMAGE:-}" ]]; then
        kubectl -n "$ns" set image ds/netpol-agent "netpol-agent=$NETPOL_AGENT_IMAGE"
    fi
    for v in $(compgen -e | grep '^FELIX_' || true); do env_args+=("$v=${!v}"); done
    if [[ ${#env_args[@]} -gt 0 ]]; then
        log "setting ${env_args[*]}"
        kubectl -n "$ns" set env ds/netpol-agent "${env_args[@]}"
    fi
    kubectl -n "$ns" rollout status ds/netpol-agent --timeout=10m
    # Ready: datastore in sync and the first full apply done, on every node.
    kubectl -n "$ns" wait pod -l app.kubernetes.io/name=netpol-agent --for=condition=Ready --timeout=5m
    kubectl -n "$ns" get pods -l app.kubernetes.io/name=netpol-agent -o wide | tee "$out/agent-pods.txt"
}

cleanup_nodes() {
    # Stopping the agent leaves its rules by design; the uninstall DaemonSet removes them
    # once the agent is gone from each node, Ready there when the node is clean.
    log "removing netpol-agent, then its rules and sets from every node (deploy/uninstall/)"
    kubectl -n "$ns" delete ds/netpol-agent --cascade=foreground --wait=true --ignore-not-found || true
    kubectl apply -k "$repo/deploy/uninstall"
    if [[ -n "${NETPOL_AGENT_IMAGE:-}" ]]; then
        kubectl -n "$ns" set image ds/netpol-agent-uninstall "uninstall=$NETPOL_AGENT_IMAGE"
    fi
    if ! kubectl -n "$ns" rollout status ds/netpol-agent-uninstall --timeout=10m; then
        log "warning: not every node reported clean in 10 minutes; see $out/cleanup.log"
    fi
    kubectl -n "$ns" logs -l app.kubernetes.io/name=netpol-agent-uninstall --tail=-1 --prefix >"$out/cleanup.log" 2>&1 || true
    kubectl delete -k "$repo/deploy/uninstall" --wait=true --ignore-not-found || true
    kubectl delete -k "${NETPOL_OVERLAY:-$repo/deploy}" --wait=true --ignore-not-found || true
}
