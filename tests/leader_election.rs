//! The leader election against the in-memory API server (kube-fake-client). What it cannot show:
//! real API latency and clock skew between nodes (e2e races two operators on a real server).

use cdn_operator::runtime::leader::Leadership;
use cdn_operator::runtime::leader::{Attempt, Config, Elector, Lost};
use cdn_operator_testkit::{poll, racing};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use kube_fake_client::interceptor::Funcs;
use kube_fake_client::ClientBuilder;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

fn config(identity: &str) -> Config {
    Config {
        namespace: "ops".into(),
        lease_name: "cdn-operator".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    }
}

fn elector(client: &kube::Client, config: Config) -> (Elector, Leadership, Gauge) {
    let leadership = Leadership::standby();
    let gauge = Gauge::default();
    let elector = Elector::new(client.clone(), config, leadership.clone(), gauge.clone());
    (elector, leadership, gauge)
}

async fn lease(client: &kube::Client) -> Lease {
    Api::<Lease>::namespaced(client.clone(), "ops")
        .get("cdn-operator")
        .await
        .unwrap()
}

fn spec_holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref().unwrap().holder_identity.clone()
}

/// Waits until `check`, polled often: some tests time a takeover.
async fn eventually(what: &str, within: Duration, check: impl Fn() -> bool) {
    let polled = poll(within, Duration::from_millis(20), || async {
        check().then_some(())
    });
    polled
        .await
        .unwrap_or_else(|| panic!("{what}: not within {within:?}"));
}

/// pod-a campaigning until it fails, once it leads.
async fn leading(
    client: &kube::Client,
) -> (tokio::task::JoinHandle<Result<(), Lost>>, Leadership, Gauge) {
    let (a, leads, gauge) = elector(client, config("pod-a"));
    let a = Arc::new(a);
    let running = tokio::spawn(async move { a.run(std::future::pending()).await });
    eventually("pod-a leads", Duration::from_secs(2), || leads.is_leader()).await;
    (running, leads, gauge)
}

#[tokio::test]
async fn two_candidates_racing_for_an_expired_lease_never_both_lead() {
    let client = ClientBuilder::new().build().await.unwrap();
    let expired: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cdn-operator", "namespace": "ops"},
        "spec": {"holderIdentity": "pod-gone", "leaseDurationSeconds": 1,
            "renewTime": "2026-01-01T00:00:00.000000Z", "acquireTime": "2026-01-01T00:00:00.000000Z",
            "leaseTransitions": 0}
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), "ops")
        .create(&Default::default(), &expired)
        .await
        .unwrap();
    let racing = racing(client.clone(), 2);
    let (a, _, _) = elector(&racing, config("pod-a"));
    let (b, _, _) = elector(&racing, config("pod-b"));
    let (ra, rb) = tokio::join!(
        a.attempt(Duration::from_secs(5)),
        b.attempt(Duration::from_secs(5))
    );
    let leading: Vec<&str> = [("pod-a", &ra), ("pod-b", &rb)]
        .into_iter()
        .filter(|(_, r)| matches!(r, Attempt::Leading))
        .map(|(who, _)| who)
        .collect();
    assert_eq!(leading.len(), 1, "exactly one leads: {ra:?} / {rb:?}");
    let holder = spec_holder(&lease(&client).await).unwrap();
    assert_eq!(holder, leading[0], "and it is the holder");
    let loser = if holder == "pod-a" { &rb } else { &ra };
    assert!(
        matches!(loser, Attempt::Failed(e) if e.contains("409") || e.contains("onflict")),
        "the other was refused by the precondition: {loser:?}"
    );
}

#[tokio::test]
async fn acquire_renew_and_stand_by() {
    let client = ClientBuilder::new().build().await.unwrap();
    let (a, _, _) = elector(&client, config("pod-a"));
    let (b, _, _) = elector(&client, config("pod-b"));

    assert!(matches!(
        a.attempt(Duration::from_secs(1)).await,
        Attempt::Leading
    ));
    let first = lease(&client).await;
    assert_eq!(spec_holder(&first), Some("pod-a".into()));
    assert_eq!(first.spec.as_ref().unwrap().lease_duration_seconds, Some(3));

    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(matches!(
        a.attempt(Duration::from_secs(1)).await,
        Attempt::Leading
    ));
    let renewed = lease(&client).await;
    let renew_time = |l: &Lease| l.spec.as_ref().unwrap().renew_time.clone().unwrap().0;
    assert!(
        renew_time(&renewed) > renew_time(&first),
        "the renewal moved renewTime"
    );

    match b.attempt(Duration::from_secs(1)).await {
        Attempt::Following { holder, retry_in } => {
            assert_eq!(holder, "pod-a");
            assert_eq!(
                retry_in,
                b.config().retry_period,
                "a live lease: retry at the period"
            );
        }
        other => panic!("pod-b must follow, got {other:?}"),
    }
    assert_eq!(spec_holder(&lease(&client).await), Some("pod-a".into()));
}

#[tokio::test]
async fn the_leader_releases_and_a_standby_takes_over_within_a_retry_period() {
    let client = ClientBuilder::new().build().await.unwrap();
    let (a, a_leads, a_gauge) = elector(&client, config("pod-a"));
    // A realistic retry period, to show the standby does not wait for it after a release.
    let (b, b_leads, b_gauge) = elector(
        &client,
        Config {
            retry_period: Duration::from_millis(1500),
            ..config("pod-b")
        },
    );

    let stop_a = Arc::new(tokio::sync::Notify::new());
    let stop = stop_a.clone();
    let a = Arc::new(a);
    let running_a = {
        let a = a.clone();
        tokio::spawn(async move { a.run(stop.notified()).await })
    };
    eventually("pod-a leads", Duration::from_secs(2), || {
        a_leads.is_leader()
    })
    .await;
    assert_eq!(a_gauge.get(), 1);

    let b = Arc::new(b);
    let running_b = {
        let b = b.clone();
        tokio::spawn(async move { b.run(std::future::pending()).await })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !b_leads.is_leader(),
        "a standby must not lead while the lease is held"
    );
    assert_eq!(b_gauge.get(), 0);
    assert!(a_leads.is_leader(), "the leader keeps renewing");

    stop_a.notify_one();
    running_a.await.unwrap().unwrap();
    a.release().await;
    assert!(!a_leads.is_leader());
    assert_eq!(a_gauge.get(), 0);
    let released = Instant::now();
    assert_eq!(spec_holder(&lease(&client).await), Some(String::new()));

    // The released lease expires one second after release; pod-b tries then, or at its next
    // retry if that comes first: within its retry period (plus scheduling slack), not the
    // 1 s expiry + a retry period it would take without looking at the expiry.
    eventually("pod-b takes over", Duration::from_millis(2000), || {
        b_leads.is_leader()
    })
    .await;
    assert!(released.elapsed() >= Duration::from_secs(1));
    assert_eq!(b_gauge.get(), 1);
    assert_eq!(spec_holder(&lease(&client).await), Some("pod-b".into()));
    running_b.abort();
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_at_once_with_an_error() {
    let client = ClientBuilder::new().build().await.unwrap();
    let (running, a_leads, a_gauge) = leading(&client).await;

    // Another replica (clock skew, a partition) writes itself in as the holder.
    let now = format!("{:.6}", jiff::Timestamp::now());
    let patch = serde_json::json!({"spec": {"holderIdentity": "pod-z", "renewTime": now}});
    Api::<Lease>::namespaced(client.clone(), "ops")
        .patch(
            "cdn-operator",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();

    let lost = tokio::time::timeout(Duration::from_secs(2), running)
        .await
        .expect("the loss is seen at the next renewal")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&lost, Lost::TakenOver { holder, .. } if holder == "pod-z"),
        "{lost}"
    );
    assert_eq!(
        lost.to_string(),
        "lost the leader election lease ops/cdn-operator: it is now held by pod-z"
    );
    assert!(!a_leads.is_leader());
    assert_eq!(a_gauge.get(), 0);
}

#[tokio::test]
async fn a_leader_that_cannot_renew_gives_up_at_the_renew_deadline() {
    let failing = Arc::new(AtomicBool::new(false));
    let fail = failing.clone();
    let client = ClientBuilder::new()
        .with_interceptor_funcs(Funcs::new().patch(move |_| {
            if fail.load(Ordering::SeqCst) {
                Err(kube_fake_client::Error::InvalidRequest(
                    "the API server is unreachable".into(),
                ))
            } else {
                Ok(None)
            }
        }))
        .build()
        .await
        .unwrap();
    let (running, a_leads, _) = leading(&client).await;
    failing.store(true, Ordering::SeqCst);
    let cut = Instant::now();

    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        a_leads.is_leader(),
        "failures within the deadline are retried"
    );
    let lost = tokio::time::timeout(Duration::from_secs(3), running)
        .await
        .expect("the leader gives up")
        .unwrap()
        .unwrap_err();
    let given_up = cut.elapsed();
    assert!(matches!(lost, Lost::RenewDeadline { .. }), "{lost}");
    assert!(
        lost.to_string().contains("the API server is unreachable"),
        "{lost}"
    );
    // Before the 3 s lease expires, so no other replica could have taken over yet.
    assert!(given_up < Duration::from_secs(3), "{given_up:?}");
    assert!(given_up >= Duration::from_millis(1700), "{given_up:?}");
    assert!(!a_leads.is_leader());
}
