//! Start-up failures: one line on stderr and a non-zero exit, never a panic.

use crate::fake_api::kubeconfig;
use crate::launch::Launch;
use cdn_operator_testkit::{free_port, Operator};
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

/// Runs the operator with `args` until it exits: its status, and what it said on stderr, which
/// must be one line.
fn failure(kubeconfig: &Path, args: &[&str], within: Duration) -> (ExitStatus, String) {
    let mut operator = Operator::start(kubeconfig, args, &[]);
    let status = operator.wait_exit(within);
    let stderr = operator.stderr();
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    (status, stderr)
}

/// Runs the operator without leader election against `kubeconfig`: it must exit 1 with one line
/// starting with `says`. That line.
fn exits_1_saying(kubeconfig: &Path, within: Duration, says: &str) -> String {
    let (status, stderr) = failure(kubeconfig, &["--leader-elect=false"], within);
    assert_eq!(status.code(), Some(1));
    assert!(stderr.starts_with(says), "{stderr}");
    stderr
}

#[test]
fn an_unreachable_api_server_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(dir.path(), free_port());
    let stderr = exits_1_saying(
        &kubeconfig,
        Duration::from_secs(30),
        "cdn-operator: cannot reach the Kubernetes API server: ",
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_broken_kubeconfig_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "clusters: [\n").unwrap();
    exits_1_saying(
        &kubeconfig,
        Duration::from_secs(20),
        "cdn-operator: cannot configure a Kubernetes client: ",
    );
}

#[test]
fn bad_flags_are_one_line_and_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(dir.path(), free_port());
    let cases: [(&[&str], &str); 11] = [
        (&["--leader-election-lease-duration=soon"], "cdn-operator: invalid value 'soon' for '--leader-election-lease-duration"),
        (&["--no-such-flag"], "cdn-operator: unexpected argument '--no-such-flag' found"),
        (&["--max-concurrent-reconciles=0"], "cdn-operator: invalid value '0' for '--max-concurrent-reconciles"),
        (
            &["--leader-election-namespace=ops", "--leader-election-renew-deadline=20s"],
            "cdn-operator: --leader-election-lease-duration (15s) must be longer than --leader-election-renew-deadline (20s)",
        ),
        (&[], "cdn-operator: cannot tell which namespace to hold the leader election lease in"),
        (&["--leader-elect=false", "--metrics-bind-address=8080"], "cdn-operator: --metrics-bind-address: `8080` is not a listen address"),
        (
            &["--leader-elect=false", "--metrics-secure=true", "--metrics-cert-dir=/nonexistent"],
            "cdn-operator: cannot read /nonexistent/tls.crt: ",
        ),
        (
            &["--leader-elect=false", "--metrics-secure=false", "--metrics-cert-dir=/tmp"],
            "cdn-operator: --metrics-cert-dir needs --metrics-secure=true",
        ),
        // controller-runtime's names.
        (
            &["--leader-elect=false", "--metrics-secure=true", "--metrics-cert-path=/nonexistent"],
            "cdn-operator: cannot read /nonexistent/tls.crt: ",
        ),
        (&["--zap-log-level=0"], "cdn-operator: invalid value '0' for '--log-level <LEVEL>': zap's numeric levels are integers > 0"),
        (
            &["--leader-elect=false", "--kubeconfig=/nonexistent"],
            "cdn-operator: cannot configure a Kubernetes client: failed to read kubeconfig from '\"/nonexistent\"'",
        ),
    ];
    for (args, expected) in cases {
        let (status, stderr) = failure(&kubeconfig, args, Duration::from_secs(20));
        assert!(!status.success(), "{args:?}");
        assert!(stderr.starts_with(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn an_unreadable_ca_bundle_for_an_https_collector_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(dir.path(), free_port());
    let missing = dir.path().join("missing.pem");
    let mut operator = Operator::start(
        &kubeconfig,
        &["--leader-elect=false"],
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "https://collector.example:4318",
            ),
            ("SSL_CERT_FILE", missing.to_str().unwrap()),
        ],
    );
    let status = operator.wait_exit(Duration::from_secs(20));
    let stderr = operator.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("cdn-operator: SSL_CERT_FILE / SSL_CERT_DIR: ")
            && stderr.contains("missing.pem"),
        "{stderr}"
    );
}
