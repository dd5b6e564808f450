//! `netpol-agent flows`: reads the flow records of one or more agents (`GET /flows`, or
//! `GET /flows/stream` with `--follow`), merges them and prints a table or JSON. Read-only;
//! the agents' filters do the filtering, so what is printed is what each agent's API answers.
//!
//! The client is plain HTTP/1.0 over a TCP connection: the agents serve the flows API on
//! their health server (plain HTTP, localhost by default, reached with `kubectl
//! port-forward`), and an HTTP/1.0 request gets a body delimited by the connection's end or
//! its length, never chunked, which keeps this client a few lines. `https://` is refused
//! with a message rather than sent in clear.
//!
//! Exit status: 0 every agent answered; 1 one or more could not be read (the others' records
//! are printed, the failures on standard error); 2 bad arguments.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::Value;

/// How long connecting and each read may take (a stream's reads excepted).
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FlowsOutput {
    /// Aligned columns for people.
    Table,
    /// JSON: one array of records (with --follow: one record a line).
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ActionArg {
    Allow,
    Deny,
}

#[derive(Args, Clone, Debug)]
pub struct FlowsArgs {
    /// An agent's health server, http://HOST:PORT (repeat for several agents; reach one with
    /// `kubectl port-forward -n <namespace> <agent pod> 9099`).
    #[arg(long = "agent", required = true, value_name = "URL")]
    pub agents: Vec<String>,
    /// Only flows with an end in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only flows with this pod (NAMESPACE/NAME) at either end.
    #[arg(long)]
    pub pod: Option<String>,
    /// Only allowed or only denied flows.
    #[arg(long, value_enum)]
    pub action: Option<ActionArg>,
    /// Only flows a policy (NAMESPACE/NAME) decided.
    #[arg(long)]
    pub policy: Option<String>,
    /// Only records that ended, or last saw traffic, at or after this time (Unix seconds or
    /// RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// Only records that started at or before this time (Unix seconds or RFC 3339).
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub output: FlowsOutput,
    /// Keep reading: print records as the agents flush them, until interrupted.
    #[arg(long)]
    pub follow: bool,
    /// With --follow: also the current interval's records every this many seconds.
    #[arg(long, value_name = "SECONDS", requires = "follow")]
    pub live: Option<u32>,
}

impl FlowsArgs {
    /// The query string the agents get.
    pub fn query(&self) -> String {
        let mut q = Vec::new();
        let mut add = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                q.push(format!("{k}={}", encode(v)));
            }
        };
        add("namespace", &self.namespace);
        add("pod", &self.pod);
        add(
            "action",
            &self.action.map(|a| match a {
                ActionArg::Allow => "allow".to_string(),
                ActionArg::Deny => "deny".to_string(),
            }),
        );
        add("policy", &self.policy);
        add("since", &self.since);
        add("until", &self.until);
        add("live", &self.live.map(|s| s.to_string()));
        q.join("&")
    }
}

/// Percent-encodes everything but unreserved characters.
fn encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `http://host:port[/prefix]` → (host:port, path prefix).
fn target(url: &str) -> Result<(String, String), String> {
    if url.starts_with("https://") {
        return Err(format!(
            "{url}: https is not supported; the flows API is plain HTTP on the agent's health server (use kubectl port-forward)"
        ));
    }
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(format!("{url}: no host"));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:9099")
    };
    Ok((authority, path.to_string()))
}

/// Sends `GET path` and returns the response's status and a reader of its body.
fn get(url: &str, path: &str, stream: bool) -> Result<(u16, BufReader<TcpStream>), String> {
    let (authority, prefix) = target(url)?;
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: no address"))?;
    let mut conn = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("{url}: {e}"))?;
    conn.set_read_timeout((!stream).then_some(TIMEOUT))
        .map_err(|e| format!("{url}: {e}"))?;
    let host = authority.clone();
    // One write: `write!` on the socket would send each piece of the format on its own, and
    // an agent that answers after the request line could close before the rest (EPIPE).
    let request =
        format!("GET {prefix}{path} HTTP/1.0\r\nHost: {host}\r\nAccept: application/json\r\n\r\n");
    conn.write_all(request.as_bytes())
        .map_err(|e| format!("{url}: {e}"))?;
    let mut reader = BufReader::new(conn);
    let mut status_line = String::new();
    reader
        .read_line(&mut status_line)
        .map_err(|e| format!("{url}: {e}"))?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{url}: not an HTTP answer: {status_line:?}"))?;
    loop {
        let mut line = String::new();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| format!("{url}: {e}"))?;
        if n == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    Ok((status, reader))
}

/// One agent's records (also `staged impact --flows URL`).
pub(super) fn fetch(url: &str, query: &str) -> Result<Vec<Value>, String> {
    let (status, mut body) = get(url, &format!("/flows?{query}"), false)?;
    let mut text = String::new();
    body.read_to_string(&mut text)
        .map_err(|e| format!("{url}: {e}"))?;
    if status != 200 {
        return Err(format!("{url}: {status}: {}", text.trim()));
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(records)) => Ok(records),
        _ => Err(format!("{url}: the answer is not a JSON array of records")),
    }
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

/// `namespace/name`, else the address.
fn end(v: &Value, side: &str) -> String {
    let (ns, name) = (
        s(v, &format!("{side}_namespace")),
        s(v, &format!("{side}_name")),
    );
    if name.is_empty() {
        s(v, &format!("{side}_ip")).to_string()
    } else {
        format!("{ns}/{name}")
    }
}

/// What decided: `ns/name#rule` of the allowing policy, the isolating policies of a deny, or
/// the verdict.
fn decided(v: &Value) -> String {
    let policies = v["policies"]["enforced_policies"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if policies.is_empty() {
        return s(v, "verdict").to_string();
    }
    policies
        .iter()
        .map(|p| {
            let name = match s(p, "namespace") {
                "" => s(p, "name").to_string(),
                ns => format!("{ns}/{}", s(p, "name")),
            };
            let tier = match s(p, "tier") {
                "" | "default" => String::new(),
                t => format!("{t}:"),
            };
            match p["rule_index"].as_i64() {
                Some(i) if i >= 0 => format!("{tier}{name}#{i}"),
                _ => format!("{tier}{name}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

const COLUMNS: [&str; 12] = [
    "START",
    "NODE",
    "REPORTER",
    "ACTION",
    "SOURCE",
    "DESTINATION",
    "PORT",
    "PROTO",
    "POLICY",
    "CONNS",
    "PACKETS",
    "BYTES",
];

/// `out/in` of a pair of counters.
fn pair(v: &Value, what: &str) -> String {
    let n = |k: String| v[k].as_u64().unwrap_or(0);
    format!("{}/{}", n(format!("{what}_out")), n(format!("{what}_in")))
}

fn row(v: &Value) -> [String; 12] {
    let port = match v["dest_port"].as_u64() {
        Some(p) => p.to_string(),
        None => "-".into(),
    };
    [
        s(v, "start_time").to_string(),
        s(v, "node").to_string(),
        s(v, "reporter").to_string(),
        s(v, "action").to_string(),
        end(v, "source"),
        end(v, "dest"),
        port,
        s(v, "proto").to_string(),
        decided(v),
        v["num_connections_started"]
            .as_u64()
            .unwrap_or(0)
            .to_string(),
        pair(v, "packets"),
        pair(v, "bytes"),
    ]
}

/// The rows as aligned columns (the last one unpadded).
pub fn table(records: &[Value]) -> String {
    let rows: Vec<[String; 12]> = records.iter().map(row).collect();
    let mut widths = COLUMNS.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let header = COLUMNS.map(String::from);
    for r in std::iter::once(&header).chain(rows.iter()) {
        let cells: Vec<String> = r
            .iter()
            .zip(widths.iter())
            .enumerate()
            .map(|(i, (c, w))| {
                if i + 1 == r.len() {
                    c.clone()
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Merges the agents' records: oldest first, then by node.
pub fn merge(mut records: Vec<Value>) -> Vec<Value> {
    records.sort_by(|a, b| {
        (s(a, "start_time"), s(a, "node"), s(a, "end_time")).cmp(&(
            s(b, "start_time"),
            s(b, "node"),
            s(b, "end_time"),
        ))
    });
    records
}

pub fn run(args: &FlowsArgs) -> ExitCode {
    for a in &args.agents {
        if let Err(e) = target(a) {
            eprintln!("netpol-agent flows: {e}");
            return ExitCode::from(2);
        }
    }
    let query = args.query();
    if args.follow {
        return follow(args, &query);
    }
    let mut all = Vec::new();
    let mut failed = false;
    for a in &args.agents {
        match fetch(a, &query) {
            Ok(records) => all.extend(records),
            Err(e) => {
                eprintln!("netpol-agent flows: {e}");
                failed = true;
            }
        }
    }
    let all = merge(all);
    let out = match args.output {
        FlowsOutput::Table => table(&all),
        FlowsOutput::Json => {
            serde_json::to_string_pretty(&Value::Array(all)).unwrap_or_default() + "\n"
        }
    };
    let _ = std::io::stdout().write_all(out.as_bytes());
    ExitCode::from(u8::from(failed))
}

/// `--follow`: one reader thread per agent, lines printed as they come.
fn follow(args: &FlowsArgs, query: &str) -> ExitCode {
    let (tx, rx) = mpsc::channel::<Result<Value, String>>();
    for a in args.agents.clone() {
        let tx = tx.clone();
        let path = format!("/flows/stream?{query}");
        std::thread::spawn(move || {
            let reader = match get(&a, &path, true) {
                Ok((200, r)) => r,
                Ok((status, mut r)) => {
                    let mut text = String::new();
                    let _ = r.read_to_string(&mut text);
                    let _ = tx.send(Err(format!("{a}: {status}: {}", text.trim())));
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if line.trim().is_empty() {
                    continue;
                }
                let sent = match serde_json::from_str::<Value>(&line) {
                    Ok(v) => tx.send(Ok(v)),
                    Err(e) => tx.send(Err(format!("{a}: a line that is no record: {e}"))),
                };
                if sent.is_err() {
                    return;
                }
            }
            let _ = tx.send(Err(format!("{a}: the stream ended")));
        });
    }
    drop(tx);
    let mut failed = false;
    let mut stdout = std::io::stdout();
    if args.output == FlowsOutput::Table {
        let _ = writeln!(stdout, "{}", COLUMNS.join("  "));
    }
    for item in rx {
        match item {
            Ok(v) => {
                let line = match args.output {
                    FlowsOutput::Table => row(&v).join("  "),
                    FlowsOutput::Json => v.to_string(),
                };
                if writeln!(stdout, "{line}")
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    break;
                }
            }
            Err(e) => {
                eprintln!("netpol-agent flows: {e}");
                failed = true;
            }
        }
    }
    ExitCode::from(u8::from(failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn urls_and_queries() {
        assert_eq!(
            target("http://127.0.0.1:9099").unwrap(),
            ("127.0.0.1:9099".into(), "".into())
        );
        assert_eq!(
            target("localhost").unwrap(),
            ("localhost:9099".into(), "".into())
        );
        assert_eq!(
            target("http://[::1]:19099/").unwrap(),
            ("[::1]:19099".into(), "".into())
        );
        assert_eq!(target("[::1]").unwrap().0, "[::1]:9099");
        assert!(target("https://x:1").is_err());
        let args = FlowsArgs {
            agents: vec![],
            namespace: Some("x".into()),
            pod: Some("x/a b".into()),
            action: Some(ActionArg::Deny),
            policy: None,
            since: Some("2026-11-27T04:00:00Z".into()),
            until: None,
            output: FlowsOutput::Table,
            follow: false,
            live: None,
        };
        assert_eq!(
            args.query(),
            "namespace=x&pod=x%2Fa%20b&action=deny&since=2026-11-27T04%3A00%3A00Z"
        );
    }

    #[test]
    fn records_merge_by_time_and_print_as_a_table() {
        let a = json!({"start_time": "2026-01-01T00:00:02Z", "node": "n1", "reporter": "Dst",
            "action": "Allow", "source_name": "c", "source_namespace": "y", "source_ip": "10.0.0.2",
            "dest_name": "s", "dest_namespace": "x", "dest_ip": "10.0.0.1", "dest_port": 80,
            "proto": "tcp", "verdict": "rule", "num_connections_started": 3, "packets_out": 7, "packets_in": 5,
            "bytes_out": 420, "bytes_in": 9000,
            "policies": {"enforced_policies": [{"kind": "NetworkPolicy", "namespace": "x",
                "name": "allow-web", "tier": "default", "rule_index": 0}]}});
        let b = json!({"start_time": "2026-01-01T00:00:01Z", "node": "n2", "reporter": "Src",
            "action": "Deny", "source_name": "", "source_ip": "192.0.2.9", "dest_name": "s",
            "dest_namespace": "x", "dest_ip": "10.0.0.1", "dest_port": null, "proto": "icmp",
            "verdict": "isolated, no rule allowed", "num_connections_started": 1,
            "policies": {"enforced_policies": [{"kind": "NetworkPolicy", "namespace": "x",
                "name": "deny", "tier": "default", "rule_index": -1}]}});
        let merged = merge(vec![a, b]);
        assert_eq!(merged[0]["node"], "n2");
        let t = table(&merged);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("START"));
        assert!(
            lines[1].contains("192.0.2.9")
                && lines[1].contains("x/deny")
                && lines[1].contains(" - ")
        );
        assert!(lines[2].contains("y/c") && lines[2].contains("x/allow-web#0"));
        assert!(lines[2].ends_with("7/5      420/9000"), "{:?}", lines[2]);
        assert!(lines[0].ends_with("PACKETS  BYTES"));
        assert!(lines[1].ends_with("0/0      0/0"), "{:?}", lines[1]);
        // Aligned: every row's DESTINATION column starts at the header's.
        let col = lines[0].find("DESTINATION").unwrap();
        assert_eq!(&lines[1][col..col + 3], "x/s");
        assert_eq!(&lines[2][col..col + 3], "x/s");
    }
}
