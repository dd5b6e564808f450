//! Felix's configuration parameters and where netpol-agent stands on each: the one table
//! behind the start-up warning for a `FELIX_*` variable we ignore (which says why) and the
//! "felix" column of docs/reference/configuration.md (generated from this table and clap's
//! definitions by `NETPOL_REGENERATE_DOCS=1 cargo test --test docs`).
//!
//! Every option with a `FELIX_*` variable has an entry (`Honoured` or `Ours`; tests/docs.rs
//! fails otherwise); a felix parameter we do not implement is `Unimplemented`, so setting it
//! is named at start as felix's, not as a typo.

/// Where netpol-agent stands on one parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Felix {
    /// Felix's parameter with felix's meaning; the text says where we differ ("" when not).
    Honoured(&'static str),
    /// Ours: felix has no such parameter (the text adds felix's nearest, or "").
    Ours(&'static str),
    /// Felix's, not implemented: what felix does with it, and why we do not.
    Unimplemented {
        what: &'static str,
        why: &'static str,
    },
}

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct FelixParam {
    pub name: &'static str,
    pub felix: Felix,
}

const fn honoured(name: &'static str, note: &'static str) -> FelixParam {
    FelixParam {
        name,
        felix: Felix::Honoured(note),
    }
}

const fn ours(name: &'static str, note: &'static str) -> FelixParam {
    FelixParam {
        name,
        felix: Felix::Ours(note),
    }
}

const fn unimplemented(name: &'static str, what: &'static str, why: &'static str) -> FelixParam {
    FelixParam {
        name,
        felix: Felix::Unimplemented { what, why },
    }
}

const LOGS_TO_STDERR: &str =
    "ignored: logs go to stderr, where the container runtime collects them";
const NOT_NETWORKING: &str = "not applicable: policy only, the CNI does networking";
const NO_HOST_ENDPOINTS: &str = "not applicable: no host endpoints";
const NOT_CNI: &str = "not applicable: the CNI owns routes and interfaces";
const OWN_WATCH: &str = "not applicable: each agent watches the API server itself";
const NOT_DATAPLANE: &str =
    "not applicable: iptables dataplane only (the nft *backend* of iptables is supported)";
const NOT_REPORTING: &str = "not applicable: no status reporting to a Calico datastore";

/// Every parameter, in the order of the configuration page.
pub const PARAMS: &[FelixParam] = &[
    honoured("FELIX_DATASTORETYPE", "felix's `kubernetes`; `etcdv3` is not applicable (Calico's own datastore); `dir:` is ours"),
    honoured("NODENAME", "as Calico's `NODENAME`"),
    honoured("FELIX_FELIXHOSTNAME", ""),
    honoured("FELIX_INTERFACEPREFIX", ""),
    ours("FELIX_INTERFACENAMESCHEME", ""),
    ours("FELIX_INTERFACEMAPFILE", ""),
    ours("FELIX_BRIDGEINTERFACE", ""),
    ours("FELIX_CRIENDPOINT", ""),
    ours("FELIX_CRIREFRESHINTERVAL", ""),
    honoured("FELIX_IPTABLESMARKMASK", "felix ≥ 3.30 also takes a drop bit"),
    ours("FELIX_KUBEIPVSSUPPORTENABLED", "felix detects `kube-ipvs0` with no setting"),
    honoured("FELIX_KUBENODEPORTRANGES", ""),
    honoured("FELIX_CHAININSERTMODE", ""),
    honoured("FELIX_DEFAULTENDPOINTTOHOSTACTION", "felix's default is `DROP`, ours is Canal's `ACCEPT`"),
    honoured("FELIX_IPTABLESFILTERALLOWACTION", ""),
    honoured("FELIX_IPTABLESFILTERDENYACTION", ""),
    honoured("FELIX_IPTABLESBACKEND", ""),
    honoured("FELIX_IPV6SUPPORT", ""),
    honoured("FELIX_MAXIPSETSIZE", ""),
    honoured("FELIX_WORKLOADSOURCESPOOFING", "in name and default; felix's `Any` lets a pod opt in with its `cni.projectcalico.org/allowedSourcePrefixes` annotation, ours turns the check off for every pod"),
    ours("FELIX_DENYLOGENABLED", "felix has no NFLOG deny log in its iptables dataplane"),
    ours("FELIX_DENYLOGNFLOGGROUP", ""),
    ours("FELIX_DENYLOGRATE", ""),
    ours("FELIX_DENYLOGBURST", ""),
    ours("FELIX_DENYLOGDEDUPWINDOW", ""),
    ours("FELIX_FLOWLOGSENABLED", "open-source felix turns collection on through its Goldmane settings (`FELIX_FLOWLOGSGOLDMANESERVER`)"),
    honoured("FELIX_FLOWLOGSFLUSHINTERVAL", "same default"),
    ours("FELIX_FLOWLOGSNFLOGGROUP", ""),
    ours("FELIX_FLOWLOGSPERPODRATE", ""),
    ours("FELIX_FLOWLOGSPERPODBURST", ""),
    ours("FELIX_POLICYUNIONMIN", ""),
    honoured("FELIX_FLOWLOGSFILEENABLED", "Calico Enterprise's name; here it needs `FELIX_FLOWLOGSENABLED`"),
    honoured("FELIX_FLOWLOGSFILEDIRECTORY", "felix's default is `/var/log/calico/flowlogs`"),
    honoured("FELIX_FLOWLOGSFILEMAXFILES", "same default"),
    honoured("FELIX_FLOWLOGSFILEMAXFILESIZEMB", "same default"),
    ours("FELIX_POLICYCOUNTERSENABLED", ""),
    ours("FELIX_POLICYCOUNTERSINTERVAL", ""),
    ours("FELIX_CONNTRACKREEVALUATE", "felix keeps established connections"),
    ours("FELIX_CONNTRACKREEVALUATEINTERVAL", ""),
    ours("FELIX_STARTUPTAINT", "felix needs none: calico-node installs the CNI configuration, so a node is not Ready before it runs"),
    honoured("FELIX_IPTABLESREFRESHINTERVAL", "felix's default is 180 (90 in v3.26); ours is longer because the change checks find tampering within a second"),
    honoured("FELIX_IPTABLESPOSTWRITECHECKINTERVALSECS", "without felix's doubling back-off; felix's default is 5"),
    honoured("FELIX_IPSETSREFRESHINTERVAL", "felix's default is 90"),
    ours("FELIX_KERNELCHECKINTERVAL", ""),
    ours("FELIX_KERNELVERIFYINTERVAL", ""),
    ours("FELIX_INTERFACEGRACEPERIOD", ""),
    honoured("FELIX_DATAPLANEWATCHDOGTIMEOUT", "same default"),
    honoured("FELIX_HEALTHENABLED", ""),
    honoured("FELIX_HEALTHHOST", ""),
    honoured("FELIX_HEALTHPORT", ""),
    ours("FELIX_PREFLIGHTOVERRIDE", ""),
    honoured("FELIX_PROMETHEUSMETRICSENABLED", ""),
    honoured("FELIX_PROMETHEUSMETRICSHOST", ""),
    honoured("FELIX_PROMETHEUSMETRICSPORT", ""),
    honoured("FELIX_PROMETHEUSMETRICSCERTFILE", "re-read when the file changes"),
    honoured("FELIX_PROMETHEUSMETRICSKEYFILE", "re-read when the file changes"),
    honoured("FELIX_PROMETHEUSMETRICSCAFILE", ""),
    honoured("FELIX_LOGSEVERITYSCREEN", ""),
    ours("FELIX_LOGFORMAT", ""),
    // Felix's parameters we do not implement; setting one is named at start with the reason.
    unimplemented("FELIX_LOGSEVERITYFILE", "felix's log file", LOGS_TO_STDERR),
    unimplemented("FELIX_LOGFILEPATH", "felix's log file", LOGS_TO_STDERR),
    unimplemented("FELIX_LOGSEVERITYSYS", "felix's syslog", LOGS_TO_STDERR),
    unimplemented("FELIX_IPTABLESLOCKFILEPATH", "felix's own xtables locking", "ignored: felix removed them (they caused deadlocks); we pass `--wait 10` to the restore tools, which take `/run/xtables.lock` themselves (the DaemonSet mounts it)"),
    unimplemented("FELIX_IPTABLESLOCKTIMEOUTSECS", "felix's own xtables locking", "ignored: felix removed them (they caused deadlocks); we pass `--wait 10` to the restore tools, which take `/run/xtables.lock` themselves (the DaemonSet mounts it)"),
    unimplemented("FELIX_IPTABLESLOCKPROBEINTERVALMILLIS", "`--wait-interval`", "ignored: iptables ≥ 1.8 blocks on the lock instead of polling"),
    unimplemented("FELIX_IPTABLESMANGLEALLOWACTION", "mangle-table allow target", "not applicable: we write only the filter table"),
    unimplemented("FELIX_IPTABLESNATOUTGOINGINTERFACEFILTER", "felix's NAT-outgoing", NOT_NETWORKING),
    unimplemented("FELIX_NATOUTGOINGADDRESS", "felix's NAT-outgoing", NOT_NETWORKING),
    unimplemented("FELIX_NATPORTRANGE", "felix's NAT-outgoing", NOT_NETWORKING),
    unimplemented("FELIX_ROUTEREFRESHINTERVAL", "felix's route and interface monitoring", NOT_CNI),
    unimplemented("FELIX_INTERFACEREFRESHINTERVAL", "felix's route and interface monitoring", NOT_CNI),
    unimplemented("FELIX_ROUTETABLERANGE", "felix's route and interface monitoring", NOT_CNI),
    unimplemented("FELIX_ROUTETABLERANGES", "felix's route and interface monitoring", NOT_CNI),
    unimplemented("FELIX_REMOVEEXTERNALROUTES", "felix's route and interface monitoring", NOT_CNI),
    unimplemented("FELIX_DEVICEROUTESOURCEADDRESS", "felix's route and interface monitoring", NOT_CNI),
    unimplemented("FELIX_NETLINKTIMEOUTSECS", "felix's route and interface monitoring", NOT_CNI),
    unimplemented("FELIX_INTERFACEEXCLUDE", "interfaces felix ignores", "not applicable: only interfaces matching our prefixes are policed"),
    unimplemented("FELIX_XDPENABLED", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_GENERICXDPENABLED", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_BPFENABLED", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_BPFLOGLEVEL", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_BPFKUBEPROXYIPTABLESCLEANUPENABLED", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_NFTABLESMODE", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_SERVICELOOPPREVENTION", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_SIDECARACCELERATIONENABLED", "felix's XDP, eBPF and native-nftables dataplanes", NOT_DATAPLANE),
    unimplemented("FELIX_IPINIPENABLED", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_IPINIPMTU", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_VXLANENABLED", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_VXLANMTU", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_VXLANPORT", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_VXLANVNI", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_WIREGUARDENABLED", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_PROMETHEUSWIREGUARDMETRICSENABLED", "Calico networking and encryption", NOT_NETWORKING),
    unimplemented("FELIX_ALLOWVXLANPACKETSFROMWORKLOADS", "felix drops encapsulated packets from pods unless set", "not applicable: we never render those drops (a pod may legitimately send UDP 4789)"),
    unimplemented("FELIX_ALLOWIPIPPACKETSFROMWORKLOADS", "felix drops encapsulated packets from pods unless set", "not applicable: we never render those drops (a pod may legitimately send UDP 4789)"),
    unimplemented("FELIX_DISABLECONNTRACKINVALIDCHECK", "omit the conntrack INVALID drop", "not implemented: the drop is always rendered"),
    unimplemented("FELIX_FAILSAFEINBOUNDHOSTPORTS", "failsafe ports of host endpoints", NO_HOST_ENDPOINTS),
    unimplemented("FELIX_FAILSAFEOUTBOUNDHOSTPORTS", "failsafe ports of host endpoints", NO_HOST_ENDPOINTS),
    unimplemented("FELIX_METADATAADDR", "the OpenStack metadata service", NO_HOST_ENDPOINTS),
    unimplemented("FELIX_METADATAPORT", "the OpenStack metadata service", NO_HOST_ENDPOINTS),
    unimplemented("FELIX_PROMETHEUSGOMETRICSENABLED", "Go runtime and process metrics", "ignored: no Go runtime; the process metrics are always exported"),
    unimplemented("FELIX_PROMETHEUSPROCESSMETRICSENABLED", "Go runtime and process metrics", "ignored: no Go runtime; the process metrics are always exported"),
    unimplemented("FELIX_HEALTHTIMEOUTOVERRIDES", "per-reporter health timeouts", "not implemented: `FELIX_DATAPLANEWATCHDOGTIMEOUT` covers both loops"),
    unimplemented("FELIX_DEBUGMEMORYPROFILEPATH", "felix's Go heap profile", "not applicable: no Go runtime"),
    unimplemented("FELIX_FLOWLOGSGOLDMANESERVER", "where felix sends flow records (Goldmane)", "not implemented: flow records are served by the agent itself (`FELIX_FLOWLOGSENABLED`)"),
    unimplemented("FELIX_POLICYSYNCPATHPREFIX", "felix's policy sync API for Dikastes", "not implemented: no application-layer policy"),
    unimplemented("FELIX_TYPHAADDR", "Typha fan-out", OWN_WATCH),
    unimplemented("FELIX_TYPHAK8SNAMESPACE", "Typha fan-out", OWN_WATCH),
    unimplemented("FELIX_TYPHAK8SSERVICENAME", "Typha fan-out", OWN_WATCH),
    unimplemented("FELIX_ETCDADDR", "Calico's etcd datastore", "not applicable: the Kubernetes API or a directory"),
    unimplemented("FELIX_ETCDENDPOINTS", "Calico's etcd datastore", "not applicable: the Kubernetes API or a directory"),
    unimplemented("FELIX_ENDPOINTREPORTINGENABLED", "status reports", NOT_REPORTING),
    unimplemented("FELIX_REPORTINGINTERVALSECS", "status reports", NOT_REPORTING),
    unimplemented("FELIX_REPORTINGTTLSECS", "status reports", NOT_REPORTING),
    unimplemented("FELIX_USAGEREPORTINGENABLED", "felix's anonymous usage reports", "not applicable: netpol-agent reports nothing"),
];

/// The entry of `name`, if felix or we have such a parameter.
pub fn lookup(name: &str) -> Option<&'static FelixParam> {
    PARAMS.iter().find(|p| p.name == name)
}

/// Why felix's parameter `name` is not implemented (`None` when ours or honoured or unknown).
pub fn unimplemented_reason(name: &str) -> Option<&'static str> {
    match lookup(name)?.felix {
        Felix::Unimplemented { why, .. } => Some(why),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_once_and_every_unimplemented_one_says_why() {
        let mut seen = std::collections::BTreeSet::new();
        for p in PARAMS {
            assert!(seen.insert(p.name), "{} twice", p.name);
            assert!(
                p.name.starts_with("FELIX_") || p.name == "NODENAME",
                "{}",
                p.name
            );
            if let Felix::Unimplemented { what, why } = p.felix {
                assert!(!what.is_empty() && !why.is_empty(), "{}", p.name);
            }
        }
        assert_eq!(
            unimplemented_reason("FELIX_IPINIPENABLED"),
            Some(NOT_NETWORKING)
        );
        assert_eq!(unimplemented_reason("FELIX_IPV6SUPPORT"), None);
        assert_eq!(unimplemented_reason("FELIX_NOSUCHTHING"), None);
    }
}
