//! The IP set writer's pure parts: `ipset save` parsing, planning against the cache, restore
//! failures.
use std::collections::{BTreeMap, BTreeSet};

use super::parse::parse_save;
use super::plan::{order_ops, KernelSets, Op, OpKind};
use super::restore::{locate, parse_restore_error, IN_USE};
use crate::model::{IpFamily, Protocol};
use crate::rules::sets::{Member, SetSpec, SetType};

const SAVE: &str = "\
create KUBE-X hash:ip family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1
add KUBE-X 10.0.0.9
create cali40s:a hash:net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x9532f0d4
add cali40s:a 10.0.0.1
add cali40s:a 10.0.0.2/32
create cali60s:b hash:net family inet6 hashsize 1024 maxelem 1048576 bucketsize 12 initval 0xae04658e
add cali60s:b fd00:0:0::1
add cali60s:b fd00::2/128
create cali40n:c hash:ip,port family inet hashsize 1024 maxelem 1048576
add cali40n:c 10.0.0.1,tcp:8080
add cali40n:c 10.0.0.1,sctp:80
create cali60n:d hash:ip,port family inet6 hashsize 1024 maxelem 1048576
add cali60n:d fd00::1,udp:53
create cali40s:cidr hash:net family inet hashsize 1024 maxelem 1048576
add cali40s:cidr 10.0.0.0/24
create cali40s:nomatch hash:net family inet hashsize 1024 maxelem 1048576
add cali40s:nomatch 10.0.0.1 nomatch
create cali40s:timeout hash:net family inet hashsize 1024 maxelem 1048576 timeout 100
add cali40s:timeout 10.0.0.1 timeout 50
create cali40s:fam hash:net family inet hashsize 1024 maxelem 1048576
add cali40s:fam fd00::1
create cali40n:icmp hash:ip,port family inet hashsize 1024 maxelem 1048576
add cali40n:icmp 10.0.0.1,icmp:echo-request
create cali40l:list list:set size 8
create cali4t3 hash:net family inet hashsize 1024 maxelem 5
garbage line
add
create
add cali40s:unknown-set 10.0.0.1
";

fn addr(s: &str) -> Member {
    Member::Addr(s.parse().unwrap())
}

#[test]
fn parses_save_output_keeping_only_ours() {
    let sets = parse_save(SAVE.as_bytes()).unwrap();
    assert!(!sets.contains_key("KUBE-X"));
    assert!(sets.contains_key("cali4t3"));
    let a = &sets["cali40s:a"];
    assert_eq!(a.family, Some(IpFamily::V4));
    assert_eq!(a.set_type, Some(SetType::HashNet));
    assert_eq!(a.maxelem, Some(1_048_576));
    assert!(!a.irregular);
    assert_eq!(
        a.members,
        BTreeSet::from([addr("10.0.0.1"), addr("10.0.0.2")])
    );
    let b = &sets["cali60s:b"];
    assert!(!b.irregular);
    assert_eq!(
        b.members,
        BTreeSet::from([addr("fd00::1"), addr("fd00::2")])
    );
    let c = &sets["cali40n:c"];
    let printed: Vec<String> = c.members.iter().map(|m| m.to_string()).collect();
    assert_eq!(printed, ["10.0.0.1,tcp:8080", "10.0.0.1,sctp:80"]);
    assert_eq!(
        sets["cali60n:d"].members.iter().next().unwrap().to_string(),
        "fd00::1,udp:53"
    );
    for odd in [
        "cali40s:cidr",
        "cali40s:nomatch",
        "cali40s:timeout",
        "cali40s:fam",
        "cali40n:icmp",
    ] {
        assert!(sets[odd].irregular, "{odd}");
    }
    assert_eq!(sets["cali40l:list"].set_type, None);
    assert_eq!(sets["cali40l:list"].family, None);
}

#[test]
fn save_parsing_survives_any_bytes() {
    let mut junk: Vec<u8> = (0u8..=255).collect();
    junk.extend_from_slice(b"\ncreate cali40s:x hash:net family\nadd cali40s:x \xff\xfe\n");
    junk.extend_from_slice(b"create cali40s:y hash:net maxelem 99999999999999\n");
    let sets = parse_save(junk.as_slice()).unwrap();
    assert_eq!(sets["cali40s:x"].family, None);
    assert!(sets["cali40s:x"].irregular);
    assert_eq!(sets["cali40s:y"].maxelem, None);
}

#[test]
fn restore_errors_name_their_line() {
    let (line, msg) = parse_restore_error(
        "ipset v7.17: Error in line 5: Set cannot be destroyed: it is in use by a kernel component\n",
    );
    assert_eq!(line, Some(5));
    assert!(msg.contains(IN_USE));
    assert_eq!(parse_restore_error("boom\n"), (None, "boom".to_string()));
    assert_eq!(parse_restore_error("Error in line x: y").0, None);
}

#[test]
fn failing_lines_map_to_their_op() {
    let ends = [2, 3, 7];
    assert_eq!(locate(&ends, 1), Some((0, 0)));
    assert_eq!(locate(&ends, 2), Some((0, 1)));
    assert_eq!(locate(&ends, 3), Some((1, 0)));
    assert_eq!(locate(&ends, 7), Some((2, 3)));
    assert_eq!(locate(&ends, 8), None);
    assert_eq!(locate(&ends, 0), None);
    assert_eq!(locate(&[], 1), None);
}

fn spec(name: &str, family: IpFamily, members: &[&str]) -> SetSpec {
    SetSpec {
        name: name.into(),
        family,
        set_type: SetType::HashNet,
        members: members.iter().map(|m| addr(m)).collect(),
    }
}

fn manager_with(save: &str, max: u32) -> KernelSets {
    let mut mgr = KernelSets::new(max);
    mgr.replace(parse_save(save.as_bytes()).unwrap());
    mgr
}

fn script(mgr: &KernelSets, ops: &[Op]) -> String {
    let mut out = String::new();
    for op in ops {
        op.render(&mut out, mgr.max_size);
    }
    out
}

#[test]
fn plans_only_what_differs_from_the_cache() {
    let mut mgr = manager_with(SAVE, 1_048_576);
    let desired = BTreeMap::from([
        (
            "cali40s:a".to_string(),
            spec("cali40s:a", IpFamily::V4, &["10.0.0.1", "10.0.0.3"]),
        ),
        (
            "cali60s:b".to_string(),
            spec("cali60s:b", IpFamily::V6, &["fd00::1", "fd00::2"]),
        ),
        (
            "cali40s:new".to_string(),
            spec("cali40s:new", IpFamily::V4, &["10.1.0.1"]),
        ),
    ]);
    let dirty: BTreeSet<String> = desired.keys().cloned().collect();
    let mut problems = BTreeSet::new();
    let ops = mgr.plan_additions(&desired, &dirty, &BTreeSet::new(), &mut problems);
    assert!(problems.is_empty());
    assert_eq!(
        script(&mgr, &ops),
        "add cali40s:a 10.0.0.3\n\
         create cali40s:new hash:net family inet hashsize 64 maxelem 1048576\n\
         add cali40s:new 10.1.0.1\n\
         del cali40s:a 10.0.0.2\n",
        "member deletions ride in the first phase, after every addition"
    );
    // Planned from the same cache (the first phase not written), the removal phase still
    // makes up for its deletions; after a written first phase it only destroys.
    let ops = mgr.plan_removals(&desired, &dirty, &BTreeSet::new());
    assert_eq!(
        script(&mgr, &ops),
        "del cali40s:a 10.0.0.2\ndestroy cali4t3\n",
        "without the first phase written, its deletions are still made up for"
    );
}

#[test]
fn replaces_sets_of_another_kind() {
    let mut mgr = manager_with(SAVE, 1_048_576);
    let mut named = spec("cali40s:a", IpFamily::V4, &[]);
    named.set_type = SetType::HashIpPort;
    let desired = BTreeMap::from([
        ("cali40s:a".to_string(), named),
        (
            "cali40s:cidr".to_string(),
            spec("cali40s:cidr", IpFamily::V4, &["10.0.0.1"]),
        ),
    ]);
    let dirty: BTreeSet<String> = desired.keys().cloned().collect();
    let ops = mgr.plan_additions(&desired, &dirty, &BTreeSet::new(), &mut BTreeSet::new());
    assert_eq!(
        script(&mgr, &ops),
        "destroy cali40s:a\n\
         create cali40s:a hash:ip,port family inet hashsize 64 maxelem 1048576\n\
         create cali4t0 hash:net family inet hashsize 64 maxelem 1048576\n\
         add cali4t0 10.0.0.1\n\
         swap cali4t0 cali40s:cidr\n"
    );
    assert!(ops[0].is_destroy_line(0) && !ops[0].is_destroy_line(1));
    assert!(!ops[1].is_destroy_line(0));
}

#[test]
fn temp_names_skip_existing_ones() {
    let mut mgr = manager_with("create cali4t0 hash:net family inet\n", 10);
    assert_eq!(mgr.temp_name(IpFamily::V4), "cali4t1");
    assert_eq!(mgr.temp_name(IpFamily::V6), "cali6t2");
}

#[test]
fn bad_desired_input_is_reported_not_written() {
    let mut mgr = manager_with("", 10);
    let mut wrong_family = spec("cali40s:f", IpFamily::V4, &["10.0.0.1", "fd00::1"]);
    wrong_family.members.insert(Member::AddrPort(
        "10.0.0.2".parse().unwrap(),
        Protocol::Tcp,
        80,
    ));
    let desired = BTreeMap::from([
        ("KUBE-X".to_string(), spec("KUBE-X", IpFamily::V4, &[])),
        ("cali4t9".to_string(), spec("cali4t9", IpFamily::V4, &[])),
        (
            "cali40s:a b".to_string(),
            spec("cali40s:a b", IpFamily::V4, &[]),
        ),
        (
            "cali40s:k".to_string(),
            spec("cali40s:other", IpFamily::V4, &[]),
        ),
        ("cali40s:f".to_string(), wrong_family),
    ]);
    let dirty: BTreeSet<String> = desired.keys().cloned().collect();
    let mut problems = BTreeSet::new();
    let ops = mgr.plan_additions(&desired, &dirty, &BTreeSet::new(), &mut problems);
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert_eq!(
        script(&mgr, &ops),
        "create cali40s:f hash:net family inet hashsize 64 maxelem 10\nadd cali40s:f 10.0.0.1\n"
    );
}

#[test]
fn failed_sets_go_last() {
    let op = |name: &str| Op {
        name: name.into(),
        family: IpFamily::V4,
        kind: OpKind::Destroy,
    };
    let ops = order_ops(
        vec![op("a"), op("b"), op("c")],
        &BTreeSet::from(["a".to_string()]),
    );
    let names: Vec<&str> = ops.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["b", "c", "a"]);
}
