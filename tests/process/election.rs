//! Leader election through the Lease endpoints: a standby writes nothing, a leader that loses
//! its lease exits, a standby takes over a released lease at once.

use crate::fake_api::{cluster, now, FakeApi, FakeState};
use crate::launch::{master_status, Launch, FAST_ELECTION, RECONCILED};
use cdn_operator_testkit::{has_line, sample, Operator};
use serde_json::json;
use std::time::{Duration, Instant};

/// The fake with one CdnCluster, and its Lease held (and renewed) by pod-b.
fn held_by_pod_b() -> FakeApi {
    FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        foreign_holder: Some("pod-b".into()),
        ..FakeState::default()
    })
}

#[test]
fn a_standby_is_ready_writes_nothing_and_exits_0_on_sigterm() {
    let api = held_by_pod_b();
    let mut operator = Operator::start(&api.kubeconfig, &FAST_ELECTION, &[]).serving();
    operator.ready("ready on standby");
    operator.wait_for("standby status", Duration::from_secs(10), |o| {
        has_line(&o.scrape(), &master_status(0))
    });
    // Several retry periods: still a standby, nothing written, nothing reconciled.
    std::thread::sleep(Duration::from_millis(1500));
    let text = operator.scrape();
    assert!(has_line(&text, &master_status(0)), "{text}");
    assert!(has_line(
        &text,
        "controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"success\"} 0"
    ));
    // The standby caches the CdnCluster but leaves counting it to the leader: the domain gauges
    // have no series here, so dashboards summing them over replicas do not count it twice.
    assert!(
        has_line(&text, "# TYPE cdn_operator_cdnclusters gauge"),
        "{text}"
    );
    assert!(!text.contains("cdn_operator_cdnclusters{"), "{text}");
    let writes: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET "))
        .collect();
    assert_eq!(writes, Vec::<String>::new(), "a standby writes nothing");

    operator.terminate();
    let status = operator.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());
    assert!(
        api.state.lock().unwrap().lease_patches.is_empty(),
        "a standby releases nothing"
    );
}

#[test]
fn a_leader_that_loses_its_lease_exits_non_zero_with_one_line() {
    let api = FakeApi::start(FakeState::default());
    let mut operator = Operator::start(&api.kubeconfig, &FAST_ELECTION, &[]).serving();
    operator.wait_for("leading", Duration::from_secs(30), |o| {
        has_line(&o.scrape(), &master_status(1))
    });
    api.state.lock().unwrap().foreign_holder = Some("pod-z".into());
    let status = operator.wait_exit(Duration::from_secs(5));
    assert_eq!(status.code(), Some(1));
    let stderr = operator.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("cdn-operator: lost the leader election lease ops/cdn-operator-leader: it is now held by pod-z"),
        "{stderr}"
    );
}

#[test]
fn a_standby_takes_over_a_released_lease_and_reconciles_everything() {
    let api = held_by_pod_b();
    // The default 2 s retry period: the takeover must not wait for it.
    let mut operator = Operator::start(
        &api.kubeconfig,
        &[
            "--leader-election-namespace=ops",
            "--leader-election-identity=pod-a",
        ],
        &[],
    )
    .serving();
    operator.ready("ready on standby");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sample(&operator.scrape(), RECONCILED), Some(0.0));

    // pod-b shuts down gracefully and releases the lease the way the library does.
    let released = Instant::now();
    {
        let mut s = api.state.lock().unwrap();
        s.foreign_holder = None;
        let lease = s.lease.as_mut().unwrap();
        lease["spec"]["holderIdentity"] = json!("");
        lease["spec"]["leaseDurationSeconds"] = json!(1);
        lease["spec"]["renewTime"] = json!(now());
    }
    operator.wait_for("leading and reconciled", Duration::from_secs(10), |o| {
        let text = o.scrape();
        has_line(&text, &master_status(1)) && sample(&text, RECONCILED) == Some(1.0)
    });
    eprintln!("measured: takeover after release {:?}", released.elapsed());
    // At most one retry period (2 s) + the reconcile, with slack for a loaded machine.
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "{:?}",
        released.elapsed()
    );
    assert!(api.requests().iter().any(|r| r.starts_with(
        "PATCH /apis/cluster.anevia.com/v1/namespaces/default/cdnclusters/origin/status"
    )));
    let lease = api.state.lock().unwrap().lease.clone().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a", "{lease}");

    operator.terminate();
    assert_eq!(operator.wait_exit(Duration::from_secs(10)).code(), Some(0));
}
