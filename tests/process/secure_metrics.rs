//! /metrics as controller-runtime's secure metrics serve it: HTTPS, and only to callers the API
//! server authenticates (TokenReview) and authorizes for `get` on `/metrics`
//! (SubjectAccessReview). The fake API server plays both reviews.

use crate::fake_api::{FakeApi, FakeState};
use crate::launch::Launch;
use cdn_operator_testkit::promtool_check_metrics;
use cdn_operator_testkit::{has_line, http_get, https_get, tls_certificate, Operator, Reply};
use std::time::Duration;

const READER: &str = "system:serviceaccount:monitoring:prometheus";
const STRANGER: &str = "system:serviceaccount:default:stranger";

fn api() -> FakeApi {
    FakeApi::start(FakeState {
        tokens: [("reader-token", READER), ("stranger-token", STRANGER)]
            .into_iter()
            .map(|(t, u)| (t.to_string(), u.to_string()))
            .collect(),
        metrics_readers: [READER.to_string()].into(),
        ..FakeState::default()
    })
}

fn scrape(operator: &Operator, token: Option<&str>) -> Reply {
    https_get(operator.metrics, "/metrics", "*/*", token).expect("an HTTPS reply")
}

fn reviews(api: &FakeApi) -> (usize, usize) {
    let requests = api.requests();
    let count = |path: &str| {
        let request = format!("POST {path}");
        requests
            .iter()
            .filter(|r| r.split('?').next() == Some(request.as_str()))
            .count()
    };
    (
        count("/apis/authentication.k8s.io/v1/tokenreviews"),
        count("/apis/authorization.k8s.io/v1/subjectaccessreviews"),
    )
}

#[test]
fn metrics_answer_over_https_only_to_callers_the_api_server_allows() {
    let api = api();
    let mut operator = Operator::start(
        &api.kubeconfig,
        &["--leader-elect=false", "--metrics-secure=true"],
        &[],
    )
    .serving();
    operator.ready("ready");
    assert!(
        operator
            .stdout()
            .lines()
            .any(|l| l.contains("serving HTTPS") && l.contains("metrics")),
        "{}",
        operator.stdout()
    );
    // The kubelet's probes stay plain HTTP, open.
    assert_eq!(
        operator.get(operator.probes, "/healthz").unwrap().status,
        200
    );

    // Plain HTTP to the HTTPS port gets no HTTP answer.
    assert_eq!(http_get(operator.metrics, "/metrics"), None);

    // No token, a token the TokenReview rejects: 401.
    let reply = scrape(&operator, None);
    assert_eq!((reply.status, reply.body.as_str()), (401, "Unauthorized\n"));
    let reply = scrape(&operator, Some("forged-token"));
    assert_eq!((reply.status, reply.body.as_str()), (401, "Unauthorized\n"));
    assert_eq!(
        reviews(&api),
        (1, 0),
        "no token, no review; the forged one reviewed once"
    );

    // Authenticated, but no RBAC for /metrics: 403.
    let reply = scrape(&operator, Some("stranger-token"));
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (
            403,
            format!("Authorization denied for user {STRANGER}\n").as_str()
        )
    );

    // Allowed: the exposition, which promtool accepts; OpenMetrics when asked for.
    let reply = scrape(&operator, Some("reader-token"));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.content_type,
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        has_line(
            &reply.body,
            "# TYPE controller_runtime_reconcile_total counter"
        ),
        "{}",
        reply.body
    );
    let (ok, report) = promtool_check_metrics(&reply.body);
    assert!(
        ok,
        "promtool check metrics failed:\n{report}\non:\n{}",
        reply.body
    );
    let open_metrics = https_get(
        operator.metrics,
        "/metrics",
        "application/openmetrics-text;version=1.0.0",
        Some("reader-token"),
    )
    .expect("an HTTPS reply");
    assert_eq!(open_metrics.status, 200);
    assert!(
        has_line(&open_metrics.body, "# EOF"),
        "{}",
        open_metrics.body
    );

    // Decisions are cached: the second scrape and the repeated refusals cost no review.
    let before = reviews(&api);
    assert_eq!(before, (3, 2));
    assert_eq!(scrape(&operator, Some("reader-token")).status, 200);
    assert_eq!(scrape(&operator, Some("stranger-token")).status, 403);
    assert_eq!(scrape(&operator, Some("forged-token")).status, 401);
    assert_eq!(reviews(&api), before);

    // Every path of the port is behind the check, not only /metrics.
    let elsewhere = https_get(operator.metrics, "/debug", "*/*", None).unwrap();
    assert_eq!(elsewhere.status, 401);
    assert_eq!(
        https_get(operator.metrics, "/debug", "*/*", Some("reader-token"))
            .unwrap()
            .status,
        403,
        "the reader may get /metrics only"
    );
}

/// A certificate pair as cert-manager writes a kubernetes.io/tls Secret: PEM files.
fn write_certificate(dir: &std::path::Path) -> Vec<u8> {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["cdn-operator-metrics.ops.svc".to_string()])
            .unwrap();
    // Written to temporary names and renamed, as the kubelet swaps a Secret volume's files.
    std::fs::write(dir.join("new.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("new.key"), signing_key.serialize_pem()).unwrap();
    std::fs::rename(dir.join("new.key"), dir.join("tls.key")).unwrap();
    std::fs::rename(dir.join("new.crt"), dir.join("tls.crt")).unwrap();
    cert.der().to_vec()
}

#[test]
fn the_certificate_of_the_cert_dir_is_served_and_reloaded_when_renewed() {
    let api = api();
    let dir = tempfile::tempdir().unwrap();
    let first = write_certificate(dir.path());
    let cert_dir = format!("--metrics-cert-dir={}", dir.path().display());
    let mut operator = Operator::start(
        &api.kubeconfig,
        &["--leader-elect=false", "--metrics-secure=true", &cert_dir],
        &[],
    )
    .serving();
    assert_eq!(tls_certificate(operator.metrics), Some(first.clone()));
    assert_eq!(scrape(&operator, Some("reader-token")).status, 200);

    let renewed = write_certificate(dir.path());
    assert_ne!(renewed, first);
    operator.wait_for(
        "the renewed certificate served",
        Duration::from_secs(25),
        |o| tls_certificate(o.metrics).as_ref() == Some(&renewed),
    );
    assert!(operator
        .stdout()
        .contains("reloaded the metrics certificate"));

    // A broken renewal keeps the certificate that works.
    let unusable = |o: &Operator| {
        o.stdout()
            .matches("the changed metrics certificate is not usable")
            .count()
    };
    let warned = unusable(&operator);
    std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
    operator.wait_for("the broken renewal noticed", Duration::from_secs(25), |o| {
        unusable(o) > warned
    });
    assert_eq!(tls_certificate(operator.metrics), Some(renewed));
    assert_eq!(scrape(&operator, Some("reader-token")).status, 200);
}
