use super::*;

#[test]
fn felix_booleans() {
    for t in ["true", "TRUE", "1", "yes", "Y", "t"] {
        assert_eq!(parse_bool(t), Ok(true), "{t}");
    }
    for f in ["false", "False", "0", "no", "N", "f"] {
        assert_eq!(parse_bool(f), Ok(false), "{f}");
    }
    assert!(parse_bool("on").unwrap_err().contains("true or false"));
}

#[test]
fn durations_are_seconds() {
    assert_eq!(parse_interval("10"), Ok(Duration::from_secs(10)));
    assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
    assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
    assert!(parse_interval("-1").is_err());
    assert!(parse_interval("10s").is_err());
    assert!(parse_post_write_check("0.01").is_err());
    assert!(parse_timeout("0").is_err());
}

#[test]
fn datastores() {
    assert_eq!(parse_datastore("kubernetes"), Ok(Datastore::Kubernetes));
    assert_eq!(parse_datastore("Kubernetes"), Ok(Datastore::Kubernetes));
    assert_eq!(
        parse_datastore("dir:/etc/x"),
        Ok(Datastore::Dir(PathBuf::from("/etc/x")))
    );
    assert!(parse_datastore("dir:").is_err());
    assert!(parse_datastore("etcdv3")
        .unwrap_err()
        .contains("kubernetes"));
}

#[test]
fn deny_log_rates_and_bursts() {
    assert_eq!(parse_deny_log_rate("10"), Ok(Rate::per_second(10)));
    assert_eq!(
        parse_deny_log_rate("3/MIN"),
        Ok(Rate {
            count: 3,
            unit: RateUnit::Minute
        })
    );
    assert_eq!(
        parse_deny_log_rate(" 2 / hour "),
        Ok(Rate {
            count: 2,
            unit: RateUnit::Hour
        })
    );
    assert!(parse_deny_log_rate("0")
        .unwrap_err()
        .contains("logs nothing"));
    assert!(parse_deny_log_rate("10001").is_err());
    assert!(parse_deny_log_rate("5/fortnight")
        .unwrap_err()
        .contains("unknown unit"));
    assert!(parse_deny_log_rate("x/sec").is_err());
    assert_eq!(parse_deny_log_burst("20"), Ok(20));
    assert!(parse_deny_log_burst("0").is_err());
    assert!(parse_deny_log_burst("10001").is_err());
    assert_eq!(parse_nflog_group("65535"), Ok(65535));
    assert!(parse_nflog_group("65536").is_err());
}

#[test]
fn mark_masks() {
    assert_eq!(parse_mark_mask("0xffff0000"), Ok(0xffff0000));
    assert_eq!(parse_mark_mask("983040"), Ok(0xf0000));
    assert!(parse_mark_mask("0x70000")
        .unwrap_err()
        .contains("at least 4"));
    assert!(parse_mark_mask("zz").is_err());
    // kube-proxy's masquerade and drop bits are refused, alone or in a wider mask.
    for overlapping in ["0xf000", "0x7c000", "0xffffffff", "0x8000f000"] {
        let e = parse_mark_mask(overlapping).unwrap_err();
        assert!(e.contains("kube-proxy"), "{overlapping}: {e}");
    }
    assert_eq!(parse_mark_mask("0xf0000000"), Ok(0xf0000000));
}

#[test]
fn unknown_and_felix_only_variables_are_told_apart() {
    let known: std::collections::BTreeSet<String> =
        ["FELIX_IPV6SUPPORT".to_string()].into_iter().collect();
    let vars = [
        "FELIX_IPV6SUPPORT",
        "FELIX_IPINIPENABLED",
        "FELIX_IPTABLESREFRESHINTERAVL",
        "PATH",
        "FELIX_IPINIPENABLED",
    ]
    .map(String::from);
    assert_eq!(
        ignored_env(&known, vars),
        [
            ("FELIX_IPINIPENABLED".to_string(), Ignored::Unimplemented),
            (
                "FELIX_IPTABLESREFRESHINTERAVL".to_string(),
                Ignored::Unknown
            ),
        ]
    );
}

#[test]
fn log_severities_are_felix_names() {
    for (name, filter) in [
        ("Debug", "debug"),
        ("INFO", "info"),
        ("warning", "warn"),
        ("Error", "error"),
        ("Fatal", "error"),
        ("Panic", "error"),
    ] {
        assert_eq!(
            LogSeverity::from_str(name, true).unwrap().filter(),
            filter,
            "{name}"
        );
    }
    assert!(LogSeverity::from_str("verbose", true).is_err());
}

#[test]
fn endpoints_are_unix_socket_paths() {
    assert_eq!(
        parse_cri_endpoint("/run/containerd/containerd.sock"),
        Ok(PathBuf::from(DEFAULT_CRI_ENDPOINT))
    );
    assert_eq!(
        parse_cri_endpoint("unix:///var/run/crio/crio.sock"),
        Ok(PathBuf::from("/var/run/crio/crio.sock"))
    );
    for bad in [
        "",
        "run/containerd.sock",
        "tcp://127.0.0.1:1234",
        "npipe:////./pipe/x",
    ] {
        let err = parse_cri_endpoint(bad).unwrap_err();
        assert!(err.contains("accepted values"), "{bad}: {err}");
    }
}
