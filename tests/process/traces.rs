//! Traces: the spans of a reconcile reach an OTLP receiver, over TLS too, with the logs
//! inside a reconcile carrying its trace id.

use crate::fake_api::{cluster, FakeApi, FakeState};
use crate::launch::{Launch, RECONCILED};
use crate::otlp::{tls_front, Receiver};
use cdn_operator_testkit::{sample, Operator};
use serde_json::Value;
use std::time::Duration;

/// Runs the operator with `args` and `env` through one reconcile of the CdnCluster, then stops
/// it with SIGTERM: it must exit 0 (a failing export never fails it).
fn one_reconcile(api: &FakeApi, args: &[&str], env: &[(&str, &str)]) -> Operator {
    let mut operator = Operator::start(&api.kubeconfig, args, env).serving();
    operator.wait_for("the CdnCluster reconciled", Duration::from_secs(30), |o| {
        sample(&o.scrape(), RECONCILED) == Some(1.0)
    });
    operator.terminate();
    let status = operator.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());
    operator
}

#[test]
fn the_spans_of_a_reconcile_reach_an_otlp_receiver_with_their_parent_links() {
    let receiver = Receiver::start();
    let http = receiver.http;

    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        ..FakeState::default()
    });
    let endpoint = format!("http://127.0.0.1:{http}");
    let operator = one_reconcile(
        &api,
        &[
            "--leader-elect=false",
            "--log-format=json",
            "--log-level=info,kube_client=debug",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "cdn-operator-test"),
            // No CA file anywhere, as in the image: plain http reads none.
            ("SSL_CERT_FILE", "/nonexistent/ca-certificates.crt"),
            ("SSL_CERT_DIR", "/nonexistent/certs"),
        ],
    );

    // Flushed at shutdown: the spans are there once the process has exited.
    let spans = receiver.spans_once("reconcile");
    let roots: Vec<&Value> = spans.iter().filter(|s| s["name"] == "reconcile").collect();
    assert_eq!(roots.len(), 1, "one reconcile, one root span: {spans:#?}");
    let root = roots[0];
    assert_eq!(root["parent_span_id"], "", "the reconcile span is a root");
    assert_eq!(root["service.name"], "cdn-operator-test");
    let attributes = &root["attributes"];
    for (key, value) in [
        ("controller", "cdncluster"),
        ("namespace", "default"),
        ("name", "origin"),
        ("result", "success"),
    ] {
        assert!(
            attributes[key]
                .as_str()
                .is_some_and(|v| v.contains(&format!("\"{value}\""))),
            "attribute {key} = {value} in {root}"
        );
    }
    let trace_id = root["trace_id"].as_str().unwrap();
    let children: Vec<&Value> = spans
        .iter()
        .filter(|s| s["parent_span_id"] == root["span_id"])
        .collect();
    // ConfigMap, Service and Deployment applies, the status, the Event.
    assert!(children.len() >= 5, "API calls as child spans: {spans:#?}");
    for child in &children {
        assert_eq!(child["trace_id"], trace_id, "{child}");
        let method = child["attributes"]["http.method"]
            .as_str()
            .unwrap_or_default();
        assert!(
            method.contains("PATCH") || method.contains("POST"),
            "{child}"
        );
    }
    assert!(
        children.iter().any(|c| c["attributes"]["http.url"]
            .as_str()
            .is_some_and(|u| u.contains("/cdnclusters/origin/status"))),
        "{children:#?}"
    );
    // No span of a watch or of the start-up: only what happened inside the reconcile.
    assert!(
        spans.iter().all(|s| s["trace_id"] == trace_id),
        "{spans:#?}"
    );

    // Logs inside the reconcile carry its trace id.
    let logs = operator.stdout();
    let inside: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["span"]
                .as_str()
                .is_some_and(|s| s.starts_with("reconcile"))
        })
        .collect();
    assert!(!inside.is_empty(), "{logs}");
    for line in inside {
        assert_eq!(line["trace_id"], trace_id, "{line}");
        assert_eq!(line["controller"], "cdncluster", "{line}");
    }
    drop(receiver);
}

#[test]
fn spans_reach_an_https_collector_verified_with_the_given_ca() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let (port, ca, _front) = tls_front(dir.path(), receiver.http);
    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        ..FakeState::default()
    });
    let endpoint = format!("https://127.0.0.1:{port}");
    let ca = ca.to_str().unwrap().to_string();
    let operator = one_reconcile(
        &api,
        &["--leader-elect=false"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
        ],
    );
    let spans = receiver.spans_once("reconcile");
    assert!(
        spans
            .iter()
            .any(|s| s["name"] == "reconcile" && s["service.name"] == "cdn-operator"),
        "over TLS: {spans:#?}\nlogs: {}",
        operator.stdout()
    );

    let reconciles = || {
        std::fs::read_to_string(&receiver.spans)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"name\": \"reconcile\""))
            .count()
    };

    // The same collector without its CA, on a machine with no CA files (the image: an empty
    // SSL_CERT_DIR leaves only the built-in roots): the operator starts, the certificate is
    // refused, nothing is delivered, and a failing export never fails the operator.
    let before = reconciles();
    let empty = dir.path().join("no-system-cas");
    std::fs::create_dir(&empty).unwrap();
    one_reconcile(
        &api,
        &["--leader-elect=false"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("SSL_CERT_DIR", empty.to_str().unwrap()),
        ],
    );
    // The operator has exited: whatever it could deliver, it has.
    assert_eq!(
        reconciles(),
        before,
        "an untrusted collector receives nothing"
    );

    // A private CA mounted into the pod and named by SSL_CERT_FILE is trusted beside the
    // built-in roots.
    one_reconcile(
        &api,
        &["--leader-elect=false"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("SSL_CERT_FILE", &ca),
        ],
    );
    assert_eq!(reconciles(), before + 1, "trusted through SSL_CERT_FILE");
}
