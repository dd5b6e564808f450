//! Felix on this node: Calico's calico-node (Calico, Canal, and CNIs that bundle its policy
//! engine) runs felix, which owns every `cali-` chain and `cali40`/`cali60` set in the
//! node's network namespace. It removes the ones it did not program on its next refresh, and
//! it already listens on 127.0.0.1:9099 (our health port too). Running beside it breaks both
//! (each deletes the other's state, and both enforce policy), so `run` refuses such a node.
//!
//! Felix is recognised by state only felix programs, whatever its mode:
//! - iptables mode: `cali-` chains in the `raw`, `mangle` or `nat` tables (felix always
//!   renders its static chains there; we only ever use `filter`), or felix's host-endpoint
//!   chains in `filter` (`cali-from-host-endpoint`, `cali-to-host-endpoint`, the
//!   `cali-th-`/`cali-fh-` families and their forward variants), in either backend and family;
//! - IP sets of felix's own names: `cali40`/`cali60` followed by something else than our
//!   `s:`/`n:` selector and named-port sets (`cali40all-ipam-pools`, `cali40masq-ipam-pools`,
//!   `cali40all-hosts-net`, ...; not `cali40this-host`, which is ours too in IPVS mode); our
//!   temporary sets are `cali4t`/`cali6t`;
//! - nftables mode: a `calico` table in any family;
//! - eBPF mode: felix's maps pinned under `/sys/fs/bpf/tc/globals/` (`cali_*`), when that
//!   file system is visible.
//!
//! [`snapshot`] reads these (best effort: a tool that is missing or fails contributes
//! nothing); [`detect`] is pure. A node that *had* felix keeps its state until Calico's own
//! clean-up removes it: the report names what was found, so an operator can remove it, or
//! override the check (`FELIX_PREFLIGHTOVERRIDE`).

use std::path::Path;

use crate::host::exec::Exec;
use crate::kernel_text::iptables_save::{self, SaveLine};

/// What the detector looks at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FelixSnapshot {
    /// `(tool, table, chain)` of every chain an `*-save` listed.
    pub chains: Vec<(String, String, String)>,
    /// Names of the IP sets in this network namespace.
    pub sets: Vec<String>,
    /// `family name` of every nftables table (`ip calico`).
    pub nft_tables: Vec<String>,
    /// Names pinned under `/sys/fs/bpf/tc/globals`.
    pub bpf_pins: Vec<String>,
}

/// Felix's chains in `filter` that we never program (host endpoints).
const FELIX_FILTER_CHAINS: [&str; 4] = [
    "cali-from-host-endpoint",
    "cali-to-host-endpoint",
    "cali-from-hep-forward",
    "cali-to-hep-forward",
];
const FELIX_FILTER_PREFIXES: [&str; 4] = ["cali-th-", "cali-fh-", "cali-thfw-", "cali-fhfw-"];

/// What says felix runs (or ran) here, one line each; empty when nothing does.
pub fn detect(s: &FelixSnapshot) -> Vec<String> {
    let mut out = Vec::new();
    let mut chains: Vec<String> = s
        .chains
        .iter()
        .filter(|(_, table, chain)| {
            chain.starts_with("cali-")
                && match table.as_str() {
                    "filter" => {
                        FELIX_FILTER_CHAINS.contains(&chain.as_str())
                            || FELIX_FILTER_PREFIXES.iter().any(|p| chain.starts_with(p))
                    }
                    _ => true,
                }
        })
        .map(|(tool, table, chain)| format!("{tool}: chain {chain} in table {table}"))
        .collect();
    chains.sort();
    chains.dedup();
    out.extend(chains);
    let felix_set = |name: &str| {
        let Some(rest) = name
            .strip_prefix("cali40")
            .or_else(|| name.strip_prefix("cali60"))
        else {
            return false;
        };
        // `this-host` is felix's name, and ours too in IPVS mode (`rules::ipvs`); felix in
        // iptables mode is still found by its raw and mangle chains.
        !(rest.starts_with("s:") || rest.starts_with("n:") || rest == "this-host")
    };
    out.extend(
        s.sets
            .iter()
            .filter(|n| felix_set(n))
            .map(|n| format!("IP set {n}")),
    );
    out.extend(
        s.nft_tables
            .iter()
            .filter(|t| t.split_whitespace().last() == Some("calico"))
            .map(|t| format!("nftables table {t}")),
    );
    out.extend(
        s.bpf_pins
            .iter()
            .filter(|n| n.starts_with("cali_"))
            .map(|n| format!("eBPF map /sys/fs/bpf/tc/globals/{n}")),
    );
    out
}

/// The refusal, as operators read it.
pub fn report(evidence: &[String]) -> String {
    const SHOWN: usize = 12;
    let mut text = String::from(
        "refusing to run: Calico's felix (calico-node) runs on this node, or did: it already \
         enforces NetworkPolicy here, owns every cali- chain and cali40/cali60 IP set (it \
         removes ours on its next refresh, and we would remove its), and holds port 9099. On \
         Calico and Canal clusters use Calico's own policy enforcement; keep netpol-agent off \
         nodes that run calico-node (a nodeSelector or affinity on its DaemonSet). Found:",
    );
    for line in evidence.iter().take(SHOWN) {
        text.push_str("\n  - ");
        text.push_str(line);
    }
    if evidence.len() > SHOWN {
        text.push_str(&format!("\n  - ... and {} more", evidence.len() - SHOWN));
    }
    text.push_str(
        "\nIf calico-node no longer runs here, this is its leftover state: remove it (Calico's \
         clean-up, or delete the chains and sets listed) or set FELIX_PREFLIGHTOVERRIDE=true \
         (--preflight-override) to run anyway.",
    );
    text
}

/// Reads the node (its network namespace) through `exec`.
pub fn snapshot(exec: &Exec) -> FelixSnapshot {
    let mut s = FelixSnapshot::default();
    for tool in [
        "iptables-legacy-save",
        "iptables-nft-save",
        "ip6tables-legacy-save",
        "ip6tables-nft-save",
    ] {
        if let Some(text) = output(exec, tool, &[]) {
            s.chains.extend(
                chain_names(&text)
                    .into_iter()
                    .map(|(table, chain)| (tool.to_string(), table, chain)),
            );
        }
    }
    if let Some(text) = output(exec, "ipset", &["list", "-n"]) {
        s.sets = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
    }
    if let Some(text) = output(exec, "nft", &["list", "tables"]) {
        s.nft_tables = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("table "))
            .map(String::from)
            .collect();
    }
    if exec.is_own_namespace() {
        if let Ok(dir) = std::fs::read_dir(Path::new("/sys/fs/bpf/tc/globals")) {
            s.bpf_pins = dir
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
        }
    }
    s
}

fn output(exec: &Exec, tool: &str, args: &[&str]) -> Option<String> {
    let out = exec
        .command(tool)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    // A save can exit non-zero after printing most tables (a set destroyed mid-read): what it
    // printed still counts.
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `(table, chain)` of every chain declaration in `iptables-save` output.
pub fn chain_names(save: &str) -> Vec<(String, String)> {
    let mut table = "";
    let mut out = Vec::new();
    for line in save.lines() {
        match iptables_save::classify(line) {
            SaveLine::Table(t) => table = t,
            SaveLine::Chain { name, .. } => out.push((table.to_string(), name.to_string())),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What our own agent leaves: filter chains and our sets only.
    fn ours() -> FelixSnapshot {
        let save = "*filter\n:INPUT ACCEPT [0:0]\n:cali-FORWARD - [0:0]\n:cali-INPUT - [0:0]\n\
                    :cali-wl-to-host - [0:0]\n:cali-fw-cali123 - [0:0]\n:cali-pi-knp/x/y - [0:0]\n\
                    :cali-from-wl-dispatch - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n";
        FelixSnapshot {
            chains: chain_names(save)
                .into_iter()
                .map(|(t, c)| ("iptables-nft-save".into(), t, c))
                .collect(),
            sets: vec![
                "cali40s:Ljkr4T5u9Q3ffN5vOEZypKS".into(),
                "cali60n:abc".into(),
                "cali4t0".into(),
                "cali40this-host".into(),
                "KUBE-CLUSTER-IP".into(),
            ],
            nft_tables: vec!["ip kube-proxy".into(), "ip6 filter".into()],
            bpf_pins: vec!["other_map".into()],
        }
    }

    #[test]
    fn our_own_state_is_not_felix() {
        assert_eq!(detect(&ours()), Vec::<String>::new());
    }

    #[test]
    fn felix_state_of_each_mode_is_found() {
        let mut s = ours();
        s.chains.push((
            "iptables-legacy-save".into(),
            "nat".into(),
            "cali-nat-outgoing".into(),
        ));
        s.chains.push((
            "iptables-legacy-save".into(),
            "raw".into(),
            "cali-PREROUTING".into(),
        ));
        s.chains.push((
            "ip6tables-nft-save".into(),
            "filter".into(),
            "cali-from-host-endpoint".into(),
        ));
        s.chains.push((
            "ip6tables-nft-save".into(),
            "filter".into(),
            "cali-th-eth0".into(),
        ));
        s.sets.push("cali40all-ipam-pools".into());
        s.sets.push("cali60all-hosts-net".into());
        s.nft_tables.push("ip calico".into());
        s.bpf_pins.push("cali_v4_arp2".into());
        let found = detect(&s);
        assert_eq!(found.len(), 8, "{found:?}");
        assert!(found
            .contains(&"iptables-legacy-save: chain cali-nat-outgoing in table nat".to_string()));
        assert!(found.contains(&"IP set cali40all-ipam-pools".to_string()));
        assert!(found.contains(&"nftables table ip calico".to_string()));
        let text = report(&found);
        assert!(text.contains("felix") && text.contains("FELIX_PREFLIGHTOVERRIDE"));
    }

    #[test]
    fn one_felix_sign_is_enough() {
        let mut s = ours();
        s.sets.push("cali40masq-ipam-pools".into());
        assert_eq!(detect(&s), ["IP set cali40masq-ipam-pools"]);
    }
}
