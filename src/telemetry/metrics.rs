//! Prometheus metrics: felix's concepts under our own prefix (`netpol_`), plus the one felix
//! lacks, the time from a local pod's first sighting (or a policy change touching it) to its
//! rules being live in the kernel.
//!
//! One process-wide registry (`global()`), created on first use whether or not it is served,
//! so the writer, the ipset manager, the dataplane and the agent instrument themselves
//! without plumbing. Hot paths touch only prometheus' atomic types: labelled series are
//! resolved once (a writer keeps the handles of its own IP family) rather than looked up
//! per call. Served as text on `/metrics` by `crate::telemetry::http` when
//! `FELIX_PROMETHEUSMETRICSENABLED` is true.

use std::sync::{Mutex, OnceLock};

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::model::IpFamily;

/// Every metric, by field. docs/reference/metrics.md lists the same names.
pub struct Metrics {
    registry: Registry,
    // iptables writer (labels: ip_version, table)
    pub iptables_restore_calls: IntCounterVec,
    pub iptables_restore_errors: IntCounterVec,
    pub iptables_save_calls: IntCounterVec,
    pub iptables_save_errors: IntCounterVec,
    pub iptables_lines_executed: IntCounterVec,
    pub iptables_chains: IntGaugeVec,
    pub iptables_rules: IntGaugeVec,
    // ipset manager
    pub ipset_calls: IntCounter,
    pub ipset_errors: IntCounter,
    pub ipset_lines_executed: IntCounter,
    pub ipsets: IntGaugeVec,
    pub ipset_members: IntGaugeVec,
    // dataplane
    pub apply_seconds: Histogram,
    pub apply_failures: IntCounter,
    pub dataplane_resyncs: IntCounter,
    pub dataplane_kernel_checks: IntCounterVec,
    pub dataplane_in_sync: IntGauge,
    pub programming_latency_seconds: Histogram,
    // calc graph and datastore
    pub calc_graph_update_seconds: Histogram,
    pub calc_graph_events: IntCounter,
    pub active_local_endpoints: IntGauge,
    pub active_local_policies: IntGauge,
    pub datastore_in_sync: IntGauge,
    pub datastore_dir_rescans: IntCounter,
    pub rejections: IntCounterVec,
    pub rejected_objects: IntGaugeVec,
    /// Local running pods with an address whose interface could not be found for longer than
    /// the grace period (a configuration that does not fit the node's CNI).
    pub local_pods_without_interface: IntGauge,
    /// Local pods a policy isolates whose interface is not known yet, dropped by address.
    pub guarded_local_pods: IntGauge,
    /// 1 while `FELIX_INTERFACENAMESCHEME=auto` has not seen how the node wires pods.
    pub wiring_pending: IntGauge,
    /// 1 while auto's wiring is pending and the node's pod ranges are not known.
    pub wiring_pending_unguarded: IntGauge,
    /// Label: kind. 1 while the API server refuses the datastore that kind (401, 403).
    pub datastore_access_refused: IntGaugeVec,
    /// 1 while the agent idles because Calico's felix (or its state) is on the node.
    pub felix_present: IntGauge,
    /// 1 while this node carries the startup taint the agent is to remove (FELIX_STARTUPTAINT).
    pub startup_taint_pending: IntGauge,
    /// Local pods with an address of a family not programmed (IPv6 support off).
    pub local_pods_unprogrammed_family: IntGauge,
    /// Labels: name, reason (`unknown`: no such parameter; `unimplemented`: felix's, not ours).
    pub config_ignored_variables: IntGaugeVec,
    // deny logging (FELIX_DENYLOGENABLED) and the kernel's rule counters
    pub deny_log_messages: IntCounter,
    pub deny_log_lost: IntCounter,
    pub deny_log_overruns: IntCounter,
    pub deny_log_undecodable: IntCounter,
    pub deny_log_lines: IntCounter,
    pub deny_log_suppressed: IntCounter,
    // flow logs (FELIX_FLOWLOGSENABLED)
    pub flow_log_messages: IntCounter,
    pub flow_log_lost: IntCounter,
    pub flow_log_overruns: IntCounter,
    pub flow_log_file_errors: IntCounter,
    pub flow_log_conntrack_errors: IntCounter,
    pub flow_log_conntrack_accounting: IntGauge,
    /// Labels: kind, name (of the staged object), change (`newly_denied`, `newly_allowed`).
    pub staged_flows: IntCounterVec,
    /// Labels: kind, namespace, policy, rule, action, direction (series of policies gone are
    /// removed; `traffic::flow_log::rule_metric`).
    pub flow_rule_connections: IntCounterVec,
    /// Labels: namespace, pod, direction (local pods only; series of pods gone are removed).
    pub denied_packets: IntCounterVec,
    /// Labels: direction.
    pub denied_unknown_interface_packets: IntCounterVec,
    /// Labels: namespace, policy, direction (active policies only).
    pub policy_packets: IntCounterVec,
    pub policy_bytes: IntCounterVec,
    pub rule_counter_read_seconds: Histogram,
    pub rule_counter_read_errors: IntCounter,
    // conntrack re-evaluation (FELIX_CONNTRACKREEVALUATE)
    pub conntrack_reevaluations: IntCounter,
    pub conntrack_entries_evaluated: IntCounter,
    /// Labels: direction (the side whose policy denies the flow now).
    pub conntrack_cuts: IntCounterVec,
    pub conntrack_errors: IntCounter,
    /// 1, labelled with the version and the git commit the binary was built from.
    pub build_info: IntGaugeVec,
}

/// The names of every metric, for documentation checks and tests.
pub const NAMES: &[&str] = &[
    "netpol_iptables_restore_calls_total",
    "netpol_iptables_restore_errors_total",
    "netpol_iptables_save_calls_total",
    "netpol_iptables_save_errors_total",
    "netpol_iptables_lines_executed_total",
    "netpol_iptables_chains",
    "netpol_iptables_rules",
    "netpol_ipset_calls_total",
    "netpol_ipset_errors_total",
    "netpol_ipset_lines_executed_total",
    "netpol_ipsets",
    "netpol_ipset_members",
    "netpol_dataplane_apply_seconds",
    "netpol_dataplane_apply_failures_total",
    "netpol_dataplane_resyncs_total",
    "netpol_dataplane_kernel_checks_total",
    "netpol_dataplane_in_sync",
    "netpol_programming_latency_seconds",
    "netpol_calc_graph_update_seconds",
    "netpol_calc_graph_events_total",
    "netpol_active_local_endpoints",
    "netpol_active_local_policies",
    "netpol_datastore_in_sync",
    "netpol_datastore_dir_rescans_total",
    "netpol_rejections_total",
    "netpol_rejected_objects",
    "netpol_local_pods_without_interface",
    "netpol_guarded_local_pods",
    "netpol_wiring_pending",
    "netpol_wiring_pending_unguarded",
    "netpol_local_pods_unprogrammed_family",
    "netpol_felix_present",
    "netpol_startup_taint_pending",
    "netpol_build_info",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// Metrics with a series only once something happened (a variable was ignored at start; the
/// API server refused a kind; a staged policy would change a logged flow's verdict; a flush counted a logged connection).
pub const WHEN_SET_NAMES: &[&str] = &[
    "netpol_config_ignored_variables",
    "netpol_datastore_access_refused",
    "netpol_staged_flows_total",
    "netpol_flow_rule_connections_total",
];

/// The metrics of deny logging and the rule counters: exported when those are on, the
/// labelled ones once something was counted for a pod or policy.
pub const TRAFFIC_NAMES: &[&str] = &[
    "netpol_deny_log_messages_total",
    "netpol_deny_log_lost_total",
    "netpol_deny_log_overruns_total",
    "netpol_deny_log_undecodable_total",
    "netpol_deny_log_lines_total",
    "netpol_deny_log_suppressed_total",
    "netpol_flow_log_messages_total",
    "netpol_flow_log_lost_total",
    "netpol_flow_log_overruns_total",
    "netpol_flow_log_file_errors_total",
    "netpol_flow_log_conntrack_errors_total",
    "netpol_flow_log_conntrack_accounting",
    "netpol_denied_packets_total",
    "netpol_denied_unknown_interface_packets_total",
    "netpol_policy_packets_total",
    "netpol_policy_bytes_total",
    "netpol_rule_counters_read_seconds",
    "netpol_rule_counters_read_errors_total",
];

/// The metrics of conntrack re-evaluation: exported when it is on.
pub const CONNTRACK_NAMES: &[&str] = &[
    "netpol_conntrack_reevaluations_total",
    "netpol_conntrack_entries_evaluated_total",
    "netpol_conntrack_cuts_total",
    "netpol_conntrack_errors_total",
];

/// One metric as docs/reference/metrics.md lists it: generated from the registrations
/// (`NETPOL_REGENERATE_DOCS=1 cargo test --test docs`), so the page and `/metrics`' HELP
/// lines say the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricDoc {
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    pub labels: Vec<String>,
    pub help: String,
}

static DOCS: Mutex<Vec<MetricDoc>> = Mutex::new(Vec::new());

/// Notes what `c` registers; `kind` "" means by name (`_total`: counter, else gauge).
fn record(c: &dyn Collector, kind: &'static str) {
    let mut docs = DOCS.lock().unwrap_or_else(|e| e.into_inner());
    for d in c.desc() {
        let kind = match kind {
            "" if d.fq_name.ends_with("_total") => "counter",
            "" => "gauge",
            k => k,
        };
        docs.push(MetricDoc {
            name: d.fq_name.clone(),
            kind,
            labels: d.variable_labels.clone(),
            help: d.help.clone(),
        });
    }
}

/// Every metric of the registry, in registration order.
pub fn docs() -> Vec<MetricDoc> {
    global();
    DOCS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn counter(reg: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    record(&c, "counter");
    reg.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn counter_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    record(&c, "counter");
    reg.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn gauge(reg: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    record(&g, "gauge");
    reg.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn gauge_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    record(&g, "gauge");
    reg.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn histogram(reg: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("valid metric");
    record(&h, "histogram");
    reg.register(Box::new(h.clone())).expect("unique metric");
    h
}

/// Buckets from `start` seconds doubling `count` times.
fn doubling(start: f64, count: usize) -> Vec<f64> {
    exponential_buckets(start, 2.0, count).expect("valid buckets")
}

impl Metrics {
    fn new() -> Metrics {
        let r = Registry::new();
        let fam = &["ip_version", "table"];
        let m = Metrics {
            iptables_restore_calls: counter_vec(
                &r,
                "netpol_iptables_restore_calls_total",
                "`iptables-restore` runs, successful or not",
                fam,
            ),
            iptables_restore_errors: counter_vec(
                &r,
                "netpol_iptables_restore_errors_total",
                "`iptables-restore` runs that failed (each is retried after a re-read)",
                fam,
            ),
            iptables_save_calls: counter_vec(
                &r,
                "netpol_iptables_save_calls_total",
                "`iptables-save` runs (first read, refresh, post-write check, after a failure)",
                fam,
            ),
            iptables_save_errors: counter_vec(
                &r,
                "netpol_iptables_save_errors_total",
                "`iptables-save` runs that failed",
                fam,
            ),
            iptables_lines_executed: counter_vec(
                &r,
                "netpol_iptables_lines_executed_total",
                "restore lines committed",
                fam,
            ),
            iptables_chains: gauge_vec(
                &r,
                "netpol_iptables_chains",
                "our chains in the table, as last read or written",
                fam,
            ),
            iptables_rules: gauge_vec(
                &r,
                "netpol_iptables_rules",
                "our rules in the table: in our chains and our rules in FORWARD/INPUT/OUTPUT",
                fam,
            ),
            ipset_calls: counter(
                &r,
                "netpol_ipset_calls_total",
                "`ipset restore` and `ipset save` runs",
            ),
            ipset_errors: counter(&r, "netpol_ipset_errors_total", "ipset runs that failed (a destroy refused because a rule still uses the set counts)"),
            ipset_lines_executed: counter(
                &r,
                "netpol_ipset_lines_executed_total",
                "command lines written to `ipset restore`",
            ),
            ipsets: gauge_vec(
                &r,
                "netpol_ipsets",
                "our IP sets in the kernel",
                &["ip_version"],
            ),
            ipset_members: gauge_vec(
                &r,
                "netpol_ipset_members",
                "members of our IP sets",
                &["ip_version"],
            ),
            apply_seconds: histogram(
                &r,
                "netpol_dataplane_apply_seconds",
                "one apply: ipset additions, iptables, ipset removals",
                doubling(0.001, 16),
            ),
            apply_failures: counter(
                &r,
                "netpol_dataplane_apply_failures_total",
                "applies that failed (retried with back-off, rules in place stay)",
            ),
            dataplane_resyncs: counter(
                &r,
                "netpol_dataplane_resyncs_total",
                "kernel re-reads started by the refresh timers, post-write checks and change checks that found a change of ours",
            ),
            dataplane_kernel_checks: counter_vec(
                &r,
                "netpol_dataplane_kernel_checks_total",
                "change checks of the kernel (`FELIX_KERNELCHECKINTERVAL`, `FELIX_KERNELVERIFYINTERVAL`): `unchanged`; `changed`: someone else changed a rule or set of ours (read and repaired; worth an alert); `unknown`: the check could not tell (our own writes since the last exact check, lost nf_tables events, a failed check), so the kernel was read — routine on a busy node",
                &["result"],
            ),
            dataplane_in_sync: gauge(
                &r,
                "netpol_dataplane_in_sync",
                "1 when the first full apply is done and the last apply succeeded",
            ),
            programming_latency_seconds: histogram(
                &r,
                "netpol_programming_latency_seconds",
                "per local pod: from the event that made its rules change (its first sighting, or a policy that selects it being added, changed or removed) entering the calculation graph, to the apply carrying that change completing — so it includes time in the graph, the queue to the dataplane, failed applies and their back-off",
                doubling(0.001, 17),
            ),
            calc_graph_update_seconds: histogram(
                &r,
                "netpol_calc_graph_update_seconds",
                "calculation-graph time of one batch of datastore events, flush included",
                exponential_buckets(0.00001, 3.0, 13).expect("valid buckets"),
            ),
            calc_graph_events: counter(
                &r,
                "netpol_calc_graph_events_total",
                "datastore events processed",
            ),
            active_local_endpoints: gauge(
                &r,
                "netpol_active_local_endpoints",
                "pods on this node with a named host interface",
            ),
            active_local_policies: gauge(
                &r,
                "netpol_active_local_policies",
                "NetworkPolicies and ClusterNetworkPolicies selecting at least one local endpoint",
            ),
            datastore_in_sync: gauge(
                &r,
                "netpol_datastore_in_sync",
                "1 once the datastore delivered its first complete listing",
            ),
            datastore_dir_rescans: counter(
                &r,
                "netpol_datastore_dir_rescans_total",
                "directory datastore: rescans, the first read included; one per burst of real changes of its files, none at rest",
            ),
            rejections: counter_vec(
                &r,
                "netpol_rejections_total",
                "rejected input: `kind` Pod, Namespace, NetworkPolicy, ClusterNetworkPolicy, the staged kinds (`reason` `invalid`, or `interface` when a local pod's veth cannot be named) or Manifest (`reason` `parse`: a broken document in the directory datastore)",
                &["kind", "reason"],
            ),
            rejected_objects: gauge_vec(
                &r,
                "netpol_rejected_objects",
                "objects currently not enforced as written, by kind",
                &["kind"],
            ),
            local_pods_without_interface: gauge(
                &r,
                "netpol_local_pods_without_interface",
                "local running pods with an address whose host interface was not found within the grace period (their traffic meets the dispatch chains' drop; docs/design/interfaces.md)",
            ),
            guarded_local_pods: gauge(
                &r,
                "netpol_guarded_local_pods",
                "local pods a policy isolates whose host interface is not known yet: their traffic is dropped by address until it is (the guard, docs/design/interfaces.md)",
            ),
            wiring_pending: gauge(
                &r,
                "netpol_wiring_pending",
                "1 while FELIX_INTERFACENAMESCHEME=auto has not seen a pod interface on this node (no pod is named; isolated pods are guarded by address), else 0",
            ),
            wiring_pending_unguarded: gauge(
                &r,
                "netpol_wiring_pending_unguarded",
                "1 while FELIX_INTERFACENAMESCHEME=auto has not seen a pod interface on this node and the node's pod ranges (spec.podCIDRs) are not known: a pod wired here on an interface without a configured prefix answers until its address reaches the agent; else 0",
            ),
            datastore_access_refused: gauge_vec(
                &r,
                "netpol_datastore_access_refused",
                "1 per kind the API server refuses to let the agent list and watch (401 or 403: its service account or RBAC); the rules stay as they are and the agent is not ready meanwhile",
                &["kind"],
            ),
            felix_present: gauge(
                &r,
                "netpol_felix_present",
                "1 while the agent idles because Calico's felix, or the state it leaves, is on this node (felix enforces there; the agent programs nothing and starts once felix is gone), else 0",
            ),
            startup_taint_pending: gauge(
                &r,
                "netpol_startup_taint_pending",
                "1 from start until the agent, ready, has removed FELIX_STARTUPTAINT's taint from this node (or found none); while 1 no new pod is scheduled here, and the log says why the removal fails; 0 when FELIX_STARTUPTAINT is empty",
            ),
            local_pods_unprogrammed_family: gauge(
                &r,
                "netpol_local_pods_unprogrammed_family",
                "local pods with an address of a family the agent does not program (an IPv6 address with FELIX_IPV6SUPPORT=false): that traffic meets no rule of ours, and the agent is not ready while there are any",
            ),
            config_ignored_variables: gauge_vec(
                &r,
                "netpol_config_ignored_variables",
                "1 per `FELIX_*` variable ignored at start: `unknown` (no option reads it) or `unimplemented` (a felix parameter we do not have)",
                &["name", "reason"],
            ),
            deny_log_messages: counter(
                &r,
                "netpol_deny_log_messages_total",
                "NFLOG messages (logged denied packets) read from the deny-log group",
            ),
            deny_log_lost: counter(
                &r,
                "netpol_deny_log_lost_total",
                "NFLOG messages the kernel sent that never arrived (gaps in the group's sequence numbers: receive-buffer overruns)",
            ),
            deny_log_overruns: counter(
                &r,
                "netpol_deny_log_overruns_total",
                "receive-buffer overruns (`ENOBUFS`) on the deny-log socket",
            ),
            flow_log_messages: counter(
                &r,
                "netpol_flow_log_messages_total",
                "NFLOG messages (first packets of new connections) read from the flow-log group",
            ),
            flow_log_lost: counter(
                &r,
                "netpol_flow_log_lost_total",
                "flow-log NFLOG messages the kernel sent that never arrived (gaps in the group's sequence numbers)",
            ),
            flow_log_overruns: counter(
                &r,
                "netpol_flow_log_overruns_total",
                "receive-buffer overruns (`ENOBUFS`) on the flow-log socket",
            ),
            flow_log_file_errors: counter(
                &r,
                "netpol_flow_log_file_errors_total",
                "flushes whose records could not be written to the flow-log file (FELIX_FLOWLOGSFILEENABLED)",
            ),
            flow_log_conntrack_errors: counter(
                &r,
                "netpol_flow_log_conntrack_errors_total",
                "flow logs: conntrack reads for packet and byte counts that failed",
            ),
            flow_log_conntrack_accounting: gauge(
                &r,
                "netpol_flow_log_conntrack_accounting",
                "flow logs: 1 when conntrack accounting (net.netfilter.nf_conntrack_acct) is on for packet and byte counts, 0 when the agent could not turn it on",
            ),
            staged_flows: counter_vec(
                &r,
                "netpol_staged_flows_total",
                "flow logs: connections of finished flow records a staged object alone would newly deny or newly allow (one series pair per staged object)",
                &["kind", "name", "change"],
            ),
            flow_rule_connections: counter_vec(
                &r,
                "netpol_flow_rule_connections_total",
                "flow logs: logged connections per policy rule that decided them, added at each flush from the finished records (`kind` and `policy` empty with `action` allow: no policy isolates the pod; with deny: isolated, no rule allowed); a policy's series are removed when the agent no longer renders it",
                &["kind", "namespace", "policy", "rule", "action", "direction"],
            ),
            deny_log_undecodable: counter(
                &r,
                "netpol_deny_log_undecodable_total",
                "NFLOG messages or logged packets that did not decode",
            ),
            deny_log_lines: counter(
                &r,
                "netpol_deny_log_lines_total",
                "deny lines written",
            ),
            deny_log_suppressed: counter(
                &r,
                "netpol_deny_log_suppressed_total",
                "logged denied packets not written because their flow already had a line in its window",
            ),
            denied_packets: counter_vec(
                &r,
                "netpol_denied_packets_total",
                "packets a local pod's policy dropped, from the kernel's counters of its \"Drop if no policies passed packet\" rule (deny logging on; read every `FELIX_POLICYCOUNTERSINTERVAL`); only local pods, and a pod's series is removed when it leaves the node",
                &["namespace", "pod", "direction"],
            ),
            denied_unknown_interface_packets: counter_vec(
                &r,
                "netpol_denied_unknown_interface_packets_total",
                "packets of pods not programmed yet dropped by the dispatch chains (deny logging on)",
                &["direction"],
            ),
            policy_packets: counter_vec(
                &r,
                "netpol_policy_packets_total",
                "packets a policy's allow rules matched (`FELIX_POLICYCOUNTERSENABLED`): new connections, since established traffic is accepted before any policy; only active policies, a policy's series removed when it stops selecting local pods; a connection a pod's union set accepts (`FELIX_POLICYUNIONMIN`, pods selected by that many policies) is not counted",
                &["namespace", "policy", "direction"],
            ),
            policy_bytes: counter_vec(
                &r,
                "netpol_policy_bytes_total",
                "bytes of those packets",
                &["namespace", "policy", "direction"],
            ),
            rule_counter_read_seconds: histogram(
                &r,
                "netpol_rule_counters_read_seconds",
                "one read of the kernel's rule counters (every family)",
                doubling(0.0001, 16),
            ),
            rule_counter_read_errors: counter(
                &r,
                "netpol_rule_counters_read_errors_total",
                "reads of the kernel's rule counters that failed (logged; enforcement does not depend on them)",
            ),
            conntrack_reevaluations: counter(
                &r,
                "netpol_conntrack_reevaluations_total",
                "re-evaluations of marked pods' tracked connections (`FELIX_CONNTRACKREEVALUATE`; at most one per interval)",
            ),
            conntrack_entries_evaluated: counter(
                &r,
                "netpol_conntrack_entries_evaluated_total",
                "conntrack entries of marked pods held against the new policy state",
            ),
            conntrack_cuts: counter_vec(
                &r,
                "netpol_conntrack_cuts_total",
                "tracked connections deleted because policy now denies them, by the direction whose policy denies them",
                &["direction"],
            ),
            conntrack_errors: counter(
                &r,
                "netpol_conntrack_errors_total",
                "conntrack listings or deletions that failed (logged)",
            ),
            build_info: gauge_vec(
                &r,
                "netpol_build_info",
                "1, labelled with the version and the git commit the binary was built from (as `--version` and the start-up line say)",
                &["version", "commit"],
            ),
            registry: r,
        };
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), env!("NETPOL_GIT_COMMIT")])
            .set(1);
        let process = crate::telemetry::process::ProcessCollector::new();
        record(&process, "");
        m.registry
            .register(Box::new(process))
            .expect("unique metric");
        // Series that exist from the start, so a scrape shows them at zero.
        for kind in ["Pod", "Namespace", "NetworkPolicy", "ClusterNetworkPolicy"] {
            m.rejected_objects.with_label_values(&[kind]).set(0);
        }
        for result in ["unchanged", "changed", "unknown"] {
            m.dataplane_kernel_checks.with_label_values(&[result]);
        }
        m
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encoding metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// The handles of one (IP family, table), resolved once.
    pub fn iptables(&self, family: IpFamily, table: &str) -> IptablesMetrics {
        let l = [ip_version(family), table];
        IptablesMetrics {
            restore_calls: self.iptables_restore_calls.with_label_values(&l),
            restore_errors: self.iptables_restore_errors.with_label_values(&l),
            save_calls: self.iptables_save_calls.with_label_values(&l),
            save_errors: self.iptables_save_errors.with_label_values(&l),
            lines: self.iptables_lines_executed.with_label_values(&l),
            chains: self.iptables_chains.with_label_values(&l),
            rules: self.iptables_rules.with_label_values(&l),
        }
    }
}

/// One writer's series.
#[derive(Clone)]
pub struct IptablesMetrics {
    pub restore_calls: IntCounter,
    pub restore_errors: IntCounter,
    pub save_calls: IntCounter,
    pub save_errors: IntCounter,
    pub lines: IntCounter,
    pub chains: IntGauge,
    pub rules: IntGauge,
}

pub fn ip_version(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "4",
        IpFamily::V6 => "6",
    }
}

static GLOBAL: OnceLock<Metrics> = OnceLock::new();

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    GLOBAL.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_exported() {
        let m = global();
        // Vec series appear once they have a label set.
        m.iptables(IpFamily::V4, "filter");
        m.ipsets.with_label_values(&["4"]);
        m.ipset_members.with_label_values(&["4"]);
        m.rejections.with_label_values(&["Pod", "invalid"]);
        m.config_ignored_variables
            .with_label_values(&["FELIX_X", "unknown"]);
        m.datastore_access_refused.with_label_values(&["Pod"]);
        m.denied_packets.with_label_values(&["x", "a", "ingress"]);
        m.denied_unknown_interface_packets
            .with_label_values(&["ingress"]);
        m.policy_packets.with_label_values(&["x", "p", "ingress"]);
        m.policy_bytes.with_label_values(&["x", "p", "ingress"]);
        m.conntrack_cuts.with_label_values(&["ingress"]);
        m.staged_flows
            .with_label_values(&["StagedNetworkPolicy", "x/p", "newly_denied"]);
        m.flow_rule_connections.with_label_values(&[
            "NetworkPolicy",
            "x",
            "p",
            "0",
            "allow",
            "ingress",
        ]);
        let text = m.encode();
        for name in NAMES
            .iter()
            .chain(TRAFFIC_NAMES)
            .chain(CONNTRACK_NAMES)
            .chain(WHEN_SET_NAMES)
        {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} missing from\n{text}"
            );
        }
    }
}
