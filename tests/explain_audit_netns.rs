//! `explain --kernel` and `audit` on a real kernel: `compile` output for the demo shop's
//! node-1 is loaded into a network namespace (both families, legacy and nft), then the
//! binary runs inside it as it would on a node. The kernel's answer agrees with the
//! policies for allowed and denied flows until the kernel is tampered with; `audit` is clean,
//! then names every tampering.

mod common;

use std::path::PathBuf;

use common::{agent_in, have, NetNs, TempDir};

fn demo() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/demo")
        .display()
        .to_string()
}

struct Node {
    ns: NetNs,
    backend: &'static str,
    _dir: TempDir,
    /// compile's iptables script (IPv4), to find chain names in.
    iptables: String,
    sets: String,
}

/// A namespace holding exactly what `compile` renders for node-1, both families.
fn node(backend: &'static str) -> Node {
    for t in ["restore", "save"] {
        assert!(
            have(&format!("iptables-{backend}-{t}")),
            "iptables-{backend}-{t} missing"
        );
    }
    let dir = TempDir::new("explain-ns");
    let ns = NetNs::new("explain");
    let mut v4 = (String::new(), String::new());
    for ipv6 in [false, true] {
        let (t, s) = (
            dir.path.join(format!("t{ipv6}")),
            dir.path.join(format!("s{ipv6}")),
        );
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_netpol-agent"));
        cmd.args(["compile", "--node", "node-1", "--manifests", &demo()]);
        if ipv6 {
            cmd.arg("--ipv6");
        }
        let out = cmd
            .arg("--iptables-out")
            .arg(&t)
            .arg("--ipsets-out")
            .arg(&s)
            .output()
            .unwrap();
        assert!(out.status.success());
        ns.sh_ok(&format!("ipset restore < '{}'", s.display()));
        let tool = if ipv6 { "ip6tables" } else { "iptables" };
        ns.restore_file(&format!("{tool}-{backend}-restore --noflush"), &t);
        if !ipv6 {
            v4 = (
                std::fs::read_to_string(&t).unwrap(),
                std::fs::read_to_string(&s).unwrap(),
            );
        }
    }
    Node {
        ns,
        backend,
        _dir: dir,
        iptables: v4.0,
        sets: v4.1,
    }
}

impl Node {
    fn run(&self, args: &[&str]) -> (i32, String) {
        self.run_env(&[], args)
    }

    fn run_env(&self, env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
        let out = agent_in(&self.ns.name)
            .envs(env.iter().copied())
            .args(args)
            .args(["--iptables-backend", self.backend])
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn explain(&self, from: &str, to: &str, port: &str) -> (i32, String) {
        self.explain_env(&[], from, to, port)
    }

    fn explain_env(&self, env: &[(&str, &str)], from: &str, to: &str, port: &str) -> (i32, String) {
        let demo = demo();
        self.run_env(
            env,
            &[
                "explain",
                "--manifests",
                &demo,
                "--node",
                "node-1",
                "--kernel",
                "--from",
                from,
                "--to",
                to,
                "--port",
                port,
            ],
        )
    }

    fn audit(&self, json: bool) -> (i32, String) {
        let demo = demo();
        let mut args = vec!["audit", "--node", "node-1", "--manifests", &demo];
        if json {
            args.extend(["--output", "json"]);
        }
        self.run(&args)
    }

    fn iptables(&self, args: &str) {
        // A shell line, so `NetNs::exec`'s `-w` does not reach it: written here.
        self.ns
            .sh_ok(&format!("iptables-{} -w {args}", self.backend));
    }

    /// The first chain of compile's output starting with `prefix`.
    fn chain(&self, prefix: &str) -> String {
        self.iptables
            .lines()
            .find_map(|l| l.strip_prefix(':').filter(|c| c.starts_with(prefix)))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no chain {prefix}*"))
            .to_string()
    }
}

fn kernel_follows_the_policies_until_tampered(backend: &'static str) {
    let n = node(backend);
    // shop/web -> shop/api on the api port: allowed, both pods on node-1.
    let (code, out) = n.explain("shop/web", "shop/api", "8080");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("kernel of node node-1 ({backend} backend, IPv4)")),
        "{out}"
    );
    assert!(out.contains("=> ACCEPT"), "{out}");
    assert!(out.contains("they agree"), "{out}");
    // The trace passes the api's ingress chain and the allow rule of api-ingress.
    assert!(out.contains("(NetworkPolicy shop/api-ingress ingress rule 0, peer 0 (pods app=web in namespace shop): allow, port 0 (TCP named port api))"), "{out}");
    // Denied: web may not reach the api's metrics port.
    let (code, out) = n.explain("shop/web", "shop/api", "9090");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("kernel: DENY, as the policies say"), "{out}");
    assert!(out.contains("Drop if no policies passed packet"), "{out}");
    // To a pod on another node: node-1 only enforces the egress side.
    let (code, out) = n.explain("shop/api", "shop/db", "5432");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("as the policies say for egress of shop/api"),
        "{out}"
    );
    // IPv6 follows the ip6tables rules.
    let (code, out) = n.explain("fd00:244:1::10", "fd00:244:1::11", "8080");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("({backend} backend, IPv6)")), "{out}");

    // Tampered: another program accepts everything in the api's ingress chain.
    let tw = n.chain("cali-tw-");
    let api = n.chain("cali-tw-cali50d8cbfc60a");
    assert!(tw.starts_with("cali-tw-"));
    n.iptables(&format!("-I {api} 1 -j ACCEPT"));
    let (code, out) = n.explain("shop/web", "shop/api", "9090");
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("!!! THE KERNEL DISAGREES WITH THE POLICIES !!!"),
        "{out}"
    );
    assert!(
        out.contains("ACCEPTS this flow, but the policies say deny"),
        "{out}"
    );
}

/// The shipped DaemonSet's `FELIX_INTERFACENAMESCHEME=auto`, as `kubectl exec` into the
/// agent's pod passes it on: resolved from how the node wires its pods, as the agent does; a
/// node with no pod interface is refused, saying so.
#[test]
fn kernel_trace_with_auto_naming() {
    let n = node("nft");
    let demo = demo();
    let auto = [("FELIX_INTERFACENAMESCHEME", "auto")];
    let (code, out) = n.explain_env(&auto, "shop/web", "shop/api", "9090");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("this node has no pod interface yet"), "{out}");
    // node-1's pods (shop/web, shop/api) wired as a routed CNI wires them: a veth each under
    // the calico name, a host route to the pod's address.
    let api = n.chain("cali-tw-cali50d8cbfc60a").replace("cali-tw-", "");
    let web = n.chain("cali-tw-cali551b05c3e54").replace("cali-tw-", "");
    for (i, (iface, ip)) in [(&web, "10.244.1.10"), (&api, "10.244.1.11")]
        .iter()
        .enumerate()
    {
        n.ns.sh_ok(&format!(
            "ip link add {iface} type veth peer name peer{i} && ip link set {iface} up && \
             ip link set peer{i} up && ip route add {ip}/32 dev {iface}"
        ));
    }
    let (code, out) = n.explain_env(&auto, "shop/web", "shop/api", "9090");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("out {api}")), "{out}");
    assert!(out.contains("kernel: DENY, as the policies say"), "{out}");
    let (code, _) = n.run_env(&auto, &["audit", "--node", "node-1", "--manifests", &demo]);
    assert_ne!(code, 2, "audit resolves auto on the node too");
}

#[test]
fn kernel_trace_legacy() {
    kernel_follows_the_policies_until_tampered("legacy");
}

#[test]
fn kernel_trace_nft() {
    kernel_follows_the_policies_until_tampered("nft");
}

fn set_named(sets: &str, holds: &str) -> String {
    // The set whose members are exactly `holds` (one address).
    sets.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("add"), Some(name), Some(m))
                    if m == holds && name.starts_with("cali40s:") =>
                {
                    Some(name.to_string())
                }
                _ => None,
            }
        })
        .unwrap_or_else(|| panic!("no set holding {holds}"))
}

fn audit_names_each_tampering(backend: &'static str) {
    let n = node(backend);
    let (code, out) = n.audit(false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node node-1: clean (IPv4, IPv6)"), "{out}");

    // Every tampering of the list, at once (the missing jump gets its own namespace: without
    // the jump nothing else is reached).
    let web_set = set_named(&n.sets, "10.244.1.10");
    let prom_set = set_named(&n.sets, "10.244.2.30");
    let api = n.chain("cali-tw-cali50d8cbfc60a");
    n.iptables("-I FORWARD 1 -i cali+ -p tcp -j ACCEPT");
    n.iptables("-A FORWARD -j LOG");
    n.iptables(&format!("-I {api} 2 -s 10.0.0.0/8 -j ACCEPT"));
    n.ns.sh_ok(&format!("ipset add {web_set} 10.244.1.99"));
    // The prometheus set is referenced only by api-ingress: empty that chain, and the set can
    // be made again with another type.
    n.iptables("-F cali-pi-knp/shop/api-ingress");
    n.ns.sh_ok(&format!(
        "ipset destroy {prom_set} && ipset create {prom_set} hash:ip family inet && ipset add {prom_set} 10.244.2.30"
    ));
    let (code, out) = n.audit(false);
    assert_eq!(code, 1, "{out}");
    for needle in [
        "bypass-above-jump: FORWARD #1: another program's rule above our jump accepts pod traffic before policy sees it: -A FORWARD -i cali+ -p tcp -j ACCEPT",
        "final-accept-not-last: FORWARD",
        &format!("foreign-rule-in-our-chain: {api} #2 is another program's rule inside a chain of ours: -A {api} -s 10.0.0.0/8 -j ACCEPT"),
        &format!("set-members-extra: set {web_set} (addresses of pods app=web in namespace shop) holds 1 it should not: 10.244.1.99"),
        &format!("set-type-changed: set {prom_set} is hash:ip family inet, should be hash:net family inet"),
        "missing-rule: cali-pi-knp/shop/api-ingress: rule cali:",
    ] {
        assert!(out.contains(needle), "not found: {needle}\n{out}");
    }
    // The missing rules are described by what they implement.
    assert!(out.contains("(NetworkPolicy shop/api-ingress ingress rule 1, peer 0 (pods app=prometheus in namespaces team=ops): allow, port 0 (TCP named port metrics))"), "{out}");
    let (_, json) = n.audit(true);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["clean"], false);

    let m = node(backend);
    m.iptables("-D FORWARD 1");
    let (code, out) = m.audit(false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("missing-jump: FORWARD has no jump into our chain"),
        "{out}"
    );
    // Rules of ours in the other backend too: a second agent, or a stale one.
    let other = if backend == "legacy" { "nft" } else { "legacy" };
    m.ns.sh_ok(&format!(
        "iptables-{other}-restore --noflush <<'EOF'\n{}EOF",
        m.iptables
    ));
    let (_, out) = m.audit(false);
    assert!(
        out.contains(&format!(
            "ours-in-other-backend: the {other} backend also holds"
        )),
        "{out}"
    );
}

#[test]
fn audit_legacy() {
    audit_names_each_tampering("legacy");
}

#[test]
fn audit_nft() {
    audit_names_each_tampering("nft");
}
