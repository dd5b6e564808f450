//! Reading a kernel's text into the interpreter's model: rule bodies split as
//! `iptables-restore` splits them and parsed into matches and a target (only the dialect we
//! render, anything else kept as not understood), the filter table's chains and policies
//! (`Ruleset::parse`), and the sets with their members (`KernelSets::parse`); the lines
//! themselves come from `crate::kernel_text`, the one reader of each format.

use super::*;

/// Splits a rule body into words; double-quoted words keep their spaces (and `\"`).
pub(super) fn words(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut has_word = false;
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_quotes => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => {
                in_quotes = !in_quotes;
                has_word = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if has_word {
                    out.push(std::mem::take(&mut cur));
                    has_word = false;
                }
            }
            c => {
                cur.push(c);
                has_word = true;
            }
        }
    }
    if has_word {
        out.push(cur);
    }
    out
}

pub(super) fn parse_num(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// `value[/mask]`; the mask defaults to all bits.
pub(super) fn parse_mark(text: &str) -> Option<(u32, u32)> {
    match text.split_once('/') {
        Some((v, m)) => Some((parse_num(v)?, parse_num(m)?)),
        None => Some((parse_num(text)?, u32::MAX)),
    }
}

pub(super) fn parse_net(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

/// `80`, `80:90`, `80,443,8000:8080`.
pub(super) fn parse_ports(text: &str) -> Option<Vec<(u16, u16)>> {
    text.split(',')
        .map(|p| match p.split_once(':') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => {
                let n = p.parse().ok()?;
                Some((n, n))
            }
        })
        .collect()
}

/// The hash of a rule whose first comment is `cali:<hash>`.
pub fn rule_hash(body: &str) -> Option<String> {
    hash_of(&words(body))
}

pub(super) fn hash_of(w: &[String]) -> Option<String> {
    let i = w.iter().position(|x| x == "--comment")?;
    w.get(i + 1)?
        .strip_prefix(RULE_HASH_PREFIX)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
}

pub(super) fn parse_rule(w: &[String]) -> ParsedRule {
    let mut matches = Vec::new();
    let mut target = Target::None;
    let mut module: Option<String> = None;
    let mut in_target = false;
    let mut neg = false;
    let mut i = 0;
    let unknown = |what: String| Match::Unknown(what);
    while i < w.len() {
        let t = w[i].as_str();
        let arg = w.get(i + 1).cloned().unwrap_or_default();
        let mut used = 2;
        match t {
            "!" => {
                neg = true;
                i += 1;
                continue;
            }
            "-s" | "--source" => matches.push(match parse_net(&arg) {
                Some(n) => Match::Src(neg, n),
                None => unknown(format!("-s {arg}")),
            }),
            "-d" | "--destination" => matches.push(match parse_net(&arg) {
                Some(n) => Match::Dst(neg, n),
                None => unknown(format!("-d {arg}")),
            }),
            "-i" | "--in-interface" => matches.push(Match::In(neg, arg)),
            "-o" | "--out-interface" => matches.push(Match::Out(neg, arg)),
            "-p" | "--protocol" => matches.push(Match::Proto(neg, arg.to_ascii_lowercase())),
            "-m" | "--match" => {
                module = Some(arg);
                in_target = false;
            }
            "-j" | "--jump" => {
                in_target = true;
                module = None;
                target = match arg.as_str() {
                    "ACCEPT" => Target::Accept,
                    "DROP" => Target::Drop,
                    "REJECT" => Target::Reject,
                    "RETURN" => Target::Return,
                    "MARK" => Target::Unknown("MARK without --set-xmark/--set-mark".into()),
                    "LOG" | "NFLOG" => Target::Log,
                    // A chain, or a target extension (CT, TPROXY, ...) that is then found to
                    // be no chain when jumped to.
                    other => Target::Jump(other.to_string()),
                };
            }
            "-g" | "--goto" => {
                target = Target::Goto(arg);
                module = None;
                in_target = false;
            }
            opt if opt.starts_with("--") && in_target => {
                match (&target, opt) {
                    (Target::Unknown(_), "--set-xmark") => {
                        target = match parse_mark(&arg) {
                            Some((v, m)) => Target::SetXMark(v, m),
                            None => Target::Unknown(format!("MARK --set-xmark {arg}")),
                        }
                    }
                    (Target::Unknown(_), "--set-mark") => {
                        target = match parse_mark(&arg) {
                            Some((v, m)) => Target::SetMark(v, m),
                            None => Target::Unknown(format!("MARK --set-mark {arg}")),
                        }
                    }
                    // REJECT --reject-with X, LOG --log-prefix X, NFLOG --nflog-group N ...
                    (Target::Reject | Target::Log, _) => {}
                    (Target::Jump(name), _) => {
                        target = Target::Unknown(format!("-j {name} {opt}"));
                    }
                    _ => {}
                }
            }
            opt if opt.starts_with("--") => {
                let m = module.as_deref().unwrap_or("");
                let parsed = match (m, opt) {
                    ("comment", "--comment") => None,
                    ("mark", "--mark") => Some(match parse_mark(&arg) {
                        Some((v, mask)) => Match::Mark(neg, v & mask, mask),
                        None => unknown(format!("--mark {arg}")),
                    }),
                    ("set", "--match-set") => {
                        let flags = w.get(i + 2).cloned().unwrap_or_default();
                        used = 3;
                        Some(Match::Set {
                            neg,
                            name: arg.clone(),
                            flags: flags.split(',').map(str::to_string).collect(),
                        })
                    }
                    ("conntrack", "--ctstate") | ("state", "--state") => Some(Match::CtState(
                        neg,
                        arg.split(',').map(str::to_string).collect(),
                    )),
                    ("multiport", "--dports" | "--destination-ports")
                    | ("tcp" | "udp" | "sctp", "--dport" | "--destination-port") => {
                        Some(match parse_ports(&arg) {
                            Some(p) => Match::DPorts(neg, p),
                            None => unknown(format!("{opt} {arg}")),
                        })
                    }
                    ("multiport", "--ports") => Some(match parse_ports(&arg) {
                        Some(p) => Match::AnyPorts(neg, p),
                        None => unknown(format!("{opt} {arg}")),
                    }),
                    ("tcp", "--syn") => {
                        used = 1;
                        Some(Match::Syn(neg))
                    }
                    ("physdev", "--physdev-in") => Some(Match::PhysIn(neg, arg.clone())),
                    ("physdev", "--physdev-out") => Some(Match::PhysOut(neg, arg.clone())),
                    ("physdev", "--physdev-is-bridged") => {
                        used = 1;
                        Some(Match::PhysIsBridged(neg))
                    }
                    ("physdev", "--physdev-is-in") => {
                        used = 1;
                        Some(Match::PhysIsIn(neg))
                    }
                    ("physdev", "--physdev-is-out") => {
                        used = 1;
                        Some(Match::PhysIsOut(neg))
                    }
                    ("icmp6", "--icmpv6-type") | ("icmp", "--icmp-type") => Some(Match::IcmpType),
                    _ => {
                        // An option we do not know: its arguments are unknown too, so the
                        // words up to the next option go with it.
                        let mut j = i + 1;
                        let mut text = format!("-m {m} {opt}");
                        while j < w.len() && !w[j].starts_with('-') && w[j] != "!" {
                            text.push(' ');
                            text.push_str(&w[j]);
                            j += 1;
                        }
                        used = j - i;
                        Some(unknown(text))
                    }
                };
                if let Some(p) = parsed {
                    matches.push(p);
                }
            }
            other => {
                matches.push(unknown(other.to_string()));
                used = 1;
            }
        }
        neg = false;
        i += used;
    }
    ParsedRule { matches, target }
}

impl KernelRule {
    pub fn new(body: impl Into<String>) -> KernelRule {
        let body = body.into();
        let w = words(&body);
        KernelRule {
            hash: hash_of(&w),
            parsed: parse_rule(&w),
            body,
        }
    }

    /// What the rule does when it matches, in `iptables` words (`ACCEPT`, `jump X`, ...).
    pub fn target_text(&self) -> String {
        match &self.parsed.target {
            Target::None => "(no target: continue)".into(),
            Target::Accept => "ACCEPT".into(),
            Target::Drop => "DROP".into(),
            Target::Reject => "REJECT".into(),
            Target::Return => "RETURN".into(),
            Target::Jump(c) => format!("jump {c}"),
            Target::Goto(c) => format!("goto {c}"),
            Target::SetXMark(v, m) => format!("MARK --set-xmark {v:#x}/{m:#x}"),
            Target::SetMark(v, m) => format!("MARK --set-mark {v:#x}/{m:#x}"),
            Target::Log => "log".into(),
            Target::Unknown(t) => format!("unknown target {t}"),
        }
    }

    /// Whether the rule's target is `ACCEPT`.
    pub fn accepts(&self) -> bool {
        self.parsed.target == Target::Accept
    }

    /// Whether the rule's target is `RETURN`.
    pub fn returns(&self) -> bool {
        self.parsed.target == Target::Return
    }

    /// The chain a jump or goto leads to.
    pub fn jump_target(&self) -> Option<&str> {
        match &self.parsed.target {
            Target::Jump(c) | Target::Goto(c) => Some(c),
            _ => None,
        }
    }

    /// Whether the rule can match the first packet of a pod's connection: an interface match
    /// can rule pods out (`-i docker0`, `-o lo`), a conntrack match new connections
    /// (`--ctstate RELATED,ESTABLISHED`), as far as the rule itself tells.
    pub fn can_match_new_pod_traffic(&self, view: &NodeView) -> bool {
        let new_ok = self.parsed.matches.iter().all(|m| match m {
            Match::CtState(neg, states) => states.iter().any(|s| s == "NEW") != *neg,
            _ => true,
        });
        new_ok && self.can_match_pod_traffic(view)
    }

    /// Whether the rule can match pod traffic at all: `false` when an interface match rules
    /// pods out (`-i docker0`, `-o lo`), as far as the rule itself tells.
    pub fn can_match_pod_traffic(&self, view: &NodeView) -> bool {
        let pod_side = |pat: &str| {
            let p = pat.trim_end_matches('+');
            let wild = pat.ends_with('+');
            view.pod_prefixes.iter().any(|pp| {
                if wild {
                    p.starts_with(pp.as_str()) || pp.starts_with(p)
                } else {
                    p.starts_with(pp.as_str())
                }
            }) || view.bridge.as_deref() == Some(p)
        };
        self.parsed.matches.iter().all(|m| match m {
            Match::In(false, pat) | Match::Out(false, pat) => pod_side(pat),
            _ => true,
        })
    }
}

impl Ruleset {
    /// Reads the `*filter` section of `iptables-save` output, or `iptables-restore` input such
    /// as `compile` prints (`-I CHAIN [N]` inserts where it says). Counters (`[p:b]`) are
    /// skipped. Text without a filter section is an empty table.
    pub fn parse(text: &str) -> Ruleset {
        let mut rs = Ruleset::default();
        let mut inside = false;
        let mut any_table = false;
        for line in iptables_save::lines(text.as_bytes()) {
            match line.kind() {
                SaveLine::Table(name) => {
                    any_table = true;
                    inside = name == "filter";
                }
                _ if any_table && !inside => {}
                SaveLine::Commit => inside = false,
                SaveLine::Chain { name, policy } => {
                    rs.chains.entry(name.to_string()).or_default();
                    if let Some(policy) = policy {
                        rs.policies.insert(name.to_string(), policy.to_string());
                    }
                }
                SaveLine::Append { chain, body } => rs
                    .chains
                    .entry(chain.to_string())
                    .or_default()
                    .push(KernelRule::new(body)),
                SaveLine::Insert {
                    chain,
                    position,
                    body,
                } => {
                    let rules = rs.chains.entry(chain.to_string()).or_default();
                    let at = position.saturating_sub(1).min(rules.len());
                    rules.insert(at, KernelRule::new(body));
                }
                SaveLine::Comment(_) | SaveLine::Other => {}
            }
        }
        for builtin in ["INPUT", "FORWARD", "OUTPUT"] {
            rs.policies
                .entry(builtin.to_string())
                .or_insert_with(|| "ACCEPT".to_string());
        }
        rs
    }

    pub fn chain(&self, name: &str) -> Option<&[KernelRule]> {
        self.chains.get(name).map(Vec::as_slice)
    }
}

impl KernelSets {
    /// Reads `ipset save` (or `ipset restore` input): every set, ours and others'.
    pub fn parse(text: &str) -> KernelSets {
        let mut sets: HashMap<String, KernelSet> = HashMap::new();
        for line in ipset_save::lines(text) {
            match line {
                SetLine::Create {
                    name,
                    set_type,
                    options,
                } => {
                    let family = match options.family() {
                        Some("inet") => Some(IpFamily::V4),
                        Some("inet6") => Some(IpFamily::V6),
                        _ => None,
                    };
                    sets.insert(
                        name.to_string(),
                        KernelSet {
                            set_type: set_type.unwrap_or_default().to_string(),
                            family,
                            ..KernelSet::default()
                        },
                    );
                }
                SetLine::Add {
                    name,
                    entry: Some(entry),
                    ..
                } => {
                    if let Some(set) = sets.get_mut(name) {
                        set.add(entry);
                    }
                }
                _ => {}
            }
        }
        KernelSets { sets }
    }
}

impl KernelSet {
    fn add(&mut self, entry: &str) {
        self.entries.push(entry.to_string());
        let readable = match self.set_type.as_str() {
            "hash:net" | "hash:ip" => match parse_net(entry) {
                Some(n) if n.prefix_len() == n.max_prefix_len() => {
                    self.hosts.insert(n.addr());
                    true
                }
                Some(n) => {
                    self.nets.push(n);
                    true
                }
                None => false,
            },
            "hash:ip,port" => {
                let parsed = entry.split_once(',').and_then(|(ip, pp)| {
                    let (proto, port) = pp.split_once(':')?;
                    let protocol = Protocol::parse(&proto.to_ascii_uppercase())?;
                    Some((ip.parse::<IpAddr>().ok()?, protocol, port.parse().ok()?))
                });
                match parsed {
                    Some(t) => {
                        self.ip_ports.insert(t);
                        true
                    }
                    None => false,
                }
            }
            _ => false,
        };
        if !readable {
            self.unreadable.push(entry.to_string());
        }
    }
}
