//! Probes and metrics over real HTTP: the exposition in both formats, linted by promtool, and
//! the names the dashboards and alerts rely on.

use crate::fake_api::{cluster, FakeApi, FakeState};
use crate::launch::{master_status, Launch, FAST_ELECTION, RECONCILED};
use cdn_operator_testkit::{has_line, http_get_accepting, sample, Operator, Reply};
use serde_json::json;
use std::time::{Duration, Instant};

/// What Prometheus 2.x sends.
const OPENMETRICS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[test]
fn leader_serves_probes_and_metrics_then_releases_the_lease_and_exits_0_on_sigterm() {
    let mut running = cluster("origin");
    running["status"] = json!({"state": "Running"});
    let api = FakeApi::start(FakeState {
        clusters: vec![running],
        ..FakeState::default()
    });
    let mut operator = Operator::start(&api.kubeconfig, &FAST_ELECTION, &[]).serving();

    operator.ready("ready");
    let Reply { status, body, .. } = operator.get(operator.probes, "/healthz").unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains("[+]cdncluster ok") && body.contains("[+]leader-election ok"),
        "{body}"
    );
    let ready = operator.get(operator.probes, "/readyz").unwrap().body;
    assert!(ready.contains("[+]cdncluster ok"), "{ready}");
    assert_eq!(
        operator.get(operator.probes, "/metrics").unwrap().status,
        404,
        "metrics are on their own port"
    );

    // The OpenMetrics scrape checked below is the one that showed the reconcile done and no
    // other in flight: the initial list and the acquisition of leadership may each trigger one.
    let mut scraped = None;
    operator.wait_for(
        "leading, the CdnCluster reconciled, and no reconcile in flight",
        Duration::from_secs(30),
        |o| {
            let reply = http_get_accepting(o.metrics, "/metrics", OPENMETRICS_ACCEPT).unwrap();
            let text = &reply.body;
            let settled = has_line(text, &master_status(1))
                && sample(text, RECONCILED).is_some_and(|n| n >= 1.0)
                && has_line(
                    text,
                    "controller_runtime_active_workers{controller=\"cdncluster\"} 0",
                );
            scraped = Some(reply);
            settled
        },
    );
    let Reply {
        status,
        content_type,
        body: text,
    } = scraped.expect("scraped");
    assert_eq!(status, 200);
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    for expected in [
        "controller_runtime_reconcile_errors_total{controller=\"cdncluster\"} 0",
        "controller_runtime_max_concurrent_reconciles{controller=\"cdncluster\"} 16",
        "controller_runtime_active_workers{controller=\"cdncluster\"} 0",
        "cdn_operator_cdnclusters{namespace=\"default\",state=\"Running\"} 1",
        "cdn_operator_cdnclusters{namespace=\"default\",state=\"WaitingSource\"} 0",
        "cdn_operator_cdnclusters{namespace=\"default\",state=\"Unknown\"} 0",
        "# TYPE cdn_operator_ats gauge",
        "# TYPE process_cpu_seconds counter",
        "# UNIT process_cpu_seconds seconds",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE process_start_time_seconds gauge",
        "# EOF",
    ] {
        assert!(
            has_line(&text, expected),
            "missing `{expected}` in:\n{text}"
        );
    }
    // What a plain client (curl, promtool) gets: the classic text format, linted by promtool.
    let Reply {
        status,
        content_type,
        body: classic,
    } = operator.get(operator.metrics, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    for expected in [
        "# TYPE controller_runtime_reconcile_total counter",
        "# TYPE controller_runtime_reconcile_errors_total counter",
        "# TYPE controller_runtime_reconcile_time_seconds histogram",
        "# TYPE controller_runtime_max_concurrent_reconciles gauge",
        "# TYPE controller_runtime_active_workers gauge",
        "# TYPE leader_election_master_status gauge",
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_max_fds gauge",
        "# TYPE cdn_operator_cdnclusters gauge",
    ] {
        assert!(
            has_line(&classic, expected),
            "missing `{expected}` in:\n{classic}"
        );
    }
    let (ok, report) = cdn_operator_testkit::promtool_check_metrics(&classic);
    assert!(
        ok,
        "promtool check metrics failed:\n{report}\non:\n{classic}"
    );
    // Why two formats: promtool (and any 0.0.4 reader) takes OpenMetrics counters, whose family
    // is named without `_total`, for families with no HELP.
    let (ok, report) = cdn_operator_testkit::promtool_check_metrics(&text);
    assert!(
        !ok && report.contains("controller_runtime_reconcile_total no help text"),
        "OpenMetrics read as 0.0.4 by promtool: {report}"
    );
    // The other half of the contract with the dashboards and alerts (tests/shipped_artifacts.rs
    // checks they use only these names): docs/metrics.txt lists exactly the series this
    // exposition serves, both ways, so a new metric cannot go undocumented. A gauge family with
    // no series yet (cdn_operator_ats: no At here) counts by its TYPE line.
    let listed: std::collections::BTreeSet<String> =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.txt"))
            .expect("docs/metrics.txt")
            .lines()
            .map(str::trim)
            .filter(|n| !n.is_empty() && !n.starts_with('#'))
            .map(str::to_string)
            .collect();
    let served: std::collections::BTreeSet<String> = classic
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(declared) => declared.strip_suffix(" gauge"),
            None if l.starts_with('#') || l.is_empty() => None,
            None => l.split(['{', ' ']).next(),
        })
        .map(str::to_string)
        .collect();
    assert_eq!(
        listed, served,
        "docs/metrics.txt (left) is not what /metrics serves (right):\n{classic}"
    );
    let series = "controller_runtime_reconcile_total{controller=\"at\",result=\"success\"} 0";
    assert!(
        has_line(&classic, series),
        "missing `{series}` in:\n{classic}"
    );
    eprintln!(
        "measured: resident memory {:?} bytes, CPU {:?} s, open fds {:?} after start-up and one reconcile",
        sample(&classic, "process_resident_memory_bytes"),
        sample(&classic, "process_cpu_seconds_total"),
        sample(&classic, "process_open_fds"),
    );

    // The reconcile wrote through the one apply path: children, then the status.
    let requests = api.requests();
    for write in [
        "PATCH /api/v1/namespaces/default/configmaps/",
        "PATCH /apis/apps/v1/namespaces/default/deployments/",
        "PATCH /apis/cluster.anevia.com/v1/namespaces/default/cdnclusters/origin/status",
    ] {
        assert!(
            requests.iter().any(|r| r.starts_with(write)),
            "no `{write}` in {requests:#?}"
        );
    }

    operator.terminate();
    let started = Instant::now();
    let status = operator.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());
    eprintln!(
        "measured: SIGTERM to exit as leader (release included) {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "within the shutdown timeout"
    );
    assert_eq!(
        operator.stderr(),
        "",
        "a clean exit prints nothing on stderr"
    );
    let state = api.state.lock().unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        state.user_agents.iter().cloned().collect::<Vec<_>>(),
        vec![format!("cdn-operator/{version}")],
        "every request, the lease's included, names the operator"
    );
    let lease = state.lease.as_ref().expect("the lease was created");
    assert_eq!(lease["spec"]["holderIdentity"], "", "released: {lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 1);
    let logs = operator.stdout();
    assert!(
        logs.contains("released the leader election lease"),
        "{logs}"
    );
}
