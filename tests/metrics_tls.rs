//! The metrics server on TLS (felix's `FELIX_PROMETHEUSMETRICS{CERT,KEY,CA}FILE`), scraped
//! the way a user's Prometheus or an operator's curl does: certificates made by `openssl`,
//! requests made by `curl`. Covers: HTTPS only (a plain request gets no metrics), client
//! certificates required and checked when a CA file is set, a rotation of the files picked up
//! by the next connection, and files that cannot be used refused at start.

mod common;

use std::path::Path;

use common::{have, run, run_ok, TempDir};
use netpol_agent::telemetry::metrics_tls::{serve_metrics_tls, MetricsTls};

/// A CA (`<name>-ca.pem`, key beside it).
fn ca(dir: &Path, name: &str) {
    let (key, cert) = (format!("{name}-ca.key"), format!("{name}-ca.pem"));
    run_ok(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} CA"),
            "-keyout",
            &dir.join(&key).to_string_lossy(),
            "-out",
            &dir.join(&cert).to_string_lossy(),
        ],
    );
}

/// A leaf `<name>.pem` / `<name>.key` signed by CA `by`, for `localhost` and 127.0.0.1.
fn leaf(dir: &Path, name: &str, by: &str, client: bool) {
    let p = |f: String| dir.join(f).to_string_lossy().into_owned();
    let ext = p(format!("{name}.ext"));
    let usage = if client { "clientAuth" } else { "serverAuth" };
    std::fs::write(
        &ext,
        format!("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
    )
    .unwrap();
    run_ok(
        "openssl",
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &p(format!("{name}.key")),
            "-out",
            &p(format!("{name}.csr")),
        ],
    );
    run_ok(
        "openssl",
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &p(format!("{name}.csr")),
            "-CA",
            &p(format!("{by}-ca.pem")),
            "-CAkey",
            &p(format!("{by}-ca.key")),
            "-CAcreateserial",
            "-extfile",
            &ext,
            "-out",
            &p(format!("{name}.pem")),
        ],
    );
}

/// `curl` of `url` with extra arguments: (success, body).
fn curl(url: &str, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["-sS", "--max-time", "10", "--fail"];
    args.extend_from_slice(extra);
    args.push(url);
    let out = run("curl", &args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn tools() -> bool {
    if have("openssl") && have("curl") {
        return true;
    }
    eprintln!("skipped: needs openssl and curl");
    false
}

#[test]
fn https_only_and_rotated_files_are_picked_up() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("metrics-tls");
    let d = &dir.path;
    ca(d, "one");
    ca(d, "two");
    leaf(d, "server", "one", false);
    let tls = MetricsTls::from_settings(
        &d.join("server.pem").to_string_lossy(),
        &d.join("server.key").to_string_lossy(),
        "",
    )
    .unwrap()
    .expect("TLS asked for");
    let addr = serve_metrics_tls("127.0.0.1", 0, tls).unwrap();
    let url = format!("https://localhost:{}/metrics", addr.port());
    let ca_one = d.join("one-ca.pem").to_string_lossy().into_owned();
    let ca_two = d.join("two-ca.pem").to_string_lossy().into_owned();

    let (ok, body) = curl(&url, &["--cacert", &ca_one]);
    assert!(ok, "scrape over TLS");
    assert!(
        body.contains("# TYPE netpol_"),
        "metrics in the body: {body:.200}"
    );
    let (ok, body) = curl(&format!("http://127.0.0.1:{}/metrics", addr.port()), &[]);
    assert!(
        !ok && !body.contains("netpol_"),
        "plain HTTP must get nothing"
    );
    let (ok, _) = curl(&url, &["--cacert", &ca_two]);
    assert!(!ok, "a certificate of another CA must not be trusted");
    let (ok, _) = curl(
        &format!("https://localhost:{}/other", addr.port()),
        &["--cacert", &ca_one],
    );
    assert!(!ok, "only /metrics is served");

    // Rotation in place: a new pair from CA two, written over the files (a later mtime).
    std::thread::sleep(std::time::Duration::from_millis(20));
    leaf(d, "server", "two", false);
    let (ok, _) = curl(&url, &["--cacert", &ca_two]);
    assert!(
        ok,
        "the rotated certificate is served to the next connection"
    );
    let (ok, _) = curl(&url, &["--cacert", &ca_one]);
    assert!(!ok, "the old certificate is gone");

    // A half-written rotation (a key of another pair) keeps the pair in use.
    leaf(d, "other", "one", false);
    std::fs::copy(d.join("other.key"), d.join("server.key")).unwrap();
    let (ok, _) = curl(&url, &["--cacert", &ca_two]);
    assert!(ok, "a key that does not match keeps the pair in use");
}

#[test]
fn a_ca_file_requires_client_certificates_it_signed() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("metrics-mtls");
    let d = &dir.path;
    ca(d, "srv");
    ca(d, "clients");
    ca(d, "stranger");
    leaf(d, "server", "srv", false);
    leaf(d, "scraper", "clients", true);
    leaf(d, "intruder", "stranger", true);
    let s = |f: &str| d.join(f).to_string_lossy().into_owned();
    let tls = MetricsTls::from_settings(&s("server.pem"), &s("server.key"), &s("clients-ca.pem"))
        .unwrap()
        .unwrap();
    let addr = serve_metrics_tls("127.0.0.1", 0, tls).unwrap();
    let url = format!("https://localhost:{}/metrics", addr.port());
    let ca = s("srv-ca.pem");
    let (ok, _) = curl(&url, &["--cacert", &ca]);
    assert!(!ok, "no client certificate: refused");
    let (ok, _) = curl(
        &url,
        &[
            "--cacert",
            &ca,
            "--cert",
            &s("intruder.pem"),
            "--key",
            &s("intruder.key"),
        ],
    );
    assert!(!ok, "a client certificate of another CA: refused");
    let (ok, body) = curl(
        &url,
        &[
            "--cacert",
            &ca,
            "--cert",
            &s("scraper.pem"),
            "--key",
            &s("scraper.key"),
        ],
    );
    assert!(
        ok && body.contains("# TYPE netpol_"),
        "the scraper's certificate: served"
    );
}

#[test]
fn settings_that_cannot_serve_tls_are_refused_never_plain() {
    assert_eq!(MetricsTls::from_settings("", "", "").unwrap(), None);
    for (cert, key, ca) in [("c.pem", "", ""), ("", "k.pem", ""), ("", "", "ca.pem")] {
        let err = MetricsTls::from_settings(cert, key, ca)
            .unwrap_err()
            .to_string();
        assert!(err.contains("FELIX_PROMETHEUSMETRICS"), "{err}");
    }
    let dir = TempDir::new("metrics-tls-missing");
    let missing = dir.path.join("absent.pem").to_string_lossy().into_owned();
    let tls = MetricsTls::from_settings(&missing, &missing, "")
        .unwrap()
        .unwrap();
    let err = format!("{:#}", serve_metrics_tls("127.0.0.1", 0, tls).unwrap_err());
    assert!(err.contains("absent.pem"), "names the file: {err}");
    // Not a certificate at all.
    std::fs::write(&missing, "not PEM\n").unwrap();
    let tls = MetricsTls::from_settings(&missing, &missing, "")
        .unwrap()
        .unwrap();
    assert!(serve_metrics_tls("127.0.0.1", 0, tls).is_err());
}
