//! Rollouts, drains and restarts under load, on the node (issue 51): the product as users run it.
//! A client like wrk (keep-alive connections, no request retried) asks 200 cached objects of
//! 60 KiB through the balancer's Service while, in turn, the CdnClusters' pods are deleted,
//! reloaded in place, rolled, scaled and evicted, and the operator is restarted. For each event
//! it prints the requests, the failed ones (an error status, a request cut, a connection refused)
//! and the objects fetched again from the origin; and how long the EndpointSlice, kube-proxy and
//! the cluster DNS take to stop sending traffic to a pod that leaves, which the preStop delay
//! must cover. Skips with one line, as the node tests do. Run by `e2e/node.sh`, or:
//! `cargo test -p cdn-operator-e2e --test rollouts` against the cluster of `e2e/node.sh up`.

use cdn_operator::cdncluster::nginx::{CACHE_STATUS_HEADER, SERVICE_PORT_NAME};
// The sidecar's DNS client: the cluster DNS asked as nginx asks it.
use cdn_operator::nginx_metrics::ring;
use cdn_operator_e2e::node::{
    apply_cluster, apply_origin, cluster_pods, cluster_running, operator_ready_and_leading,
    origin_requests_matching, ready_pods, service_address, until, Counters, Load, NodeTest, Scope,
    Snapshot, OPERATOR_PODS, ORIGIN_PODS,
};
use cdn_operator_e2e::say;
use cdn_operator_testkit::KeepAlive;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long CdnClusters get to be Running, every pod Ready (images present: seconds; generous
/// for a busy machine).
const WAIT: Duration = Duration::from_secs(240);
const OBJECTS: usize = 200;
/// The client's connections, each on a thread of its own.
const CONNECTIONS: usize = 16;
/// After each event has settled (every pod Ready, none leaving): the load goes on this long
/// before the next, so what the event moved (DNS, rings, Services) has moved.
const SETTLE: Duration = Duration::from_secs(10);
const HOST: &str = "cdn.node-e2e.test";
/// The cluster DNS of `e2e/node.sh` (`HOST:53`), which the test asks for a leaving pod's records.
const CLUSTER_DNS_ENV: &str = "CDN_E2E_CLUSTER_DNS";

fn object(i: usize) -> String {
    format!("/big/{i:04}.ts")
}

async fn snapshot(counters: &Counters, client: &Client, ns: &str, origin: &str) -> Snapshot {
    Snapshot {
        requests: counters.requests.load(Ordering::Relaxed),
        failed_status: counters.failed_status.load(Ordering::Relaxed),
        cut: counters.cut.load(Ordering::Relaxed),
        refused: counters.refused.load(Ordering::Relaxed),
        origin: origin_requests_matching(client, ns, origin, "/big/").await,
    }
}

fn cache(replicas: i32, valid: &str, cpu: &str) -> serde_json::Value {
    json!({
        "role": "cache",
        "replicas": replicas,
        "cache": {"size": "256m", "valid": valid},
        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "sources": [{"name": "store", "origin": {"service": {"name": "origin", "port": 8080}}}],
    })
}

fn balancer(cpu: &str) -> serde_json::Value {
    json!({
        "role": "balancer",
        "replicas": 2,
        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "sources": [{"name": "cache-a"}, {"name": "cache-b"}],
    })
}

/// Waits until CdnCluster `name` runs its `replicas` pods, all Ready and none leaving.
async fn settled(client: &Client, ns: &str, name: &str) {
    cluster_running(client, ns, name, WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    until(&format!("no pod of {name} leaving"), WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels(&cluster_pods(name)))
            .await
            .map_err(|e| e.to_string())?;
        let leaving: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.name_any())
            .collect();
        leaving
            .is_empty()
            .then_some(())
            .ok_or(format!("leaving: {leaving:?}"))
    })
    .await;
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_else(|| panic!("pod {} has no IP", pod.name_any()))
}

/// When a pod that leaves stops being sent traffic, from the call that deletes it: its endpoint
/// no longer ready in the EndpointSlice, its address gone from kube-proxy's rules (a Service with
/// an address), from the cluster DNS's answer (a headless Service, which the balancers' nginx
/// look up).
#[derive(Debug, Default)]
struct Leaving {
    endpoint: Option<Duration>,
    kube_proxy: Option<Duration>,
    dns: Option<Duration>,
}

async fn ready_in_slices(client: &Client, ns: &str, service: &str, ip: &str) -> bool {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let Ok(list) = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
    else {
        return true;
    };
    list.items.iter().any(|slice| {
        slice.endpoints.iter().flatten().any(|e| {
            e.addresses.iter().any(|a| a == ip)
                && e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
        })
    })
}

fn in_kube_proxy_rules(ip: &str) -> Option<bool> {
    let out = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).contains(&format!("--to-destination {ip}:")))
}

/// Deletes `pod` (of CdnCluster `service`, whose Service has its name) and follows it leaving.
async fn delete_and_follow(client: &Client, ns: &str, service: &str, pod: &Pod) -> Leaving {
    let ip = pod_ip(pod);
    let name = format!("{service}.{ns}.svc.cluster.local");
    // The cluster DNS, when it names the pod (a headless Service): followed too.
    let mut dns: Option<SocketAddr> = std::env::var(CLUSTER_DNS_ENV)
        .ok()
        .and_then(|a| a.parse().ok());
    if let Some(server) = dns {
        if !ring::addresses(server, &name)
            .await
            .is_some_and(|a| a.contains(&ip))
        {
            dns = None;
        }
    }
    let headless = dns.is_some();
    let proxied = in_kube_proxy_rules(&ip) == Some(true);
    let started = Instant::now();
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(&pod.name_any(), &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting pod {}: {e}", pod.name_any()));
    let mut leaving = Leaving::default();
    while started.elapsed() < Duration::from_secs(30) {
        if leaving.endpoint.is_none() && !ready_in_slices(client, ns, service, &ip).await {
            leaving.endpoint = Some(started.elapsed());
        }
        if proxied && leaving.kube_proxy.is_none() && in_kube_proxy_rules(&ip) == Some(false) {
            leaving.kube_proxy = Some(started.elapsed());
        }
        if let (Some(server), None) = (dns, leaving.dns) {
            if ring::addresses(server, &name)
                .await
                .is_some_and(|answer| !answer.contains(&ip))
            {
                leaving.dns = Some(started.elapsed());
            }
        }
        let done = leaving.endpoint.is_some()
            && (!proxied || leaving.kube_proxy.is_some())
            && (!headless || leaving.dns.is_some());
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    leaving
}

/// Evicts every pod of CdnCluster `name` through the eviction API, as `kubectl drain` does: an
/// eviction its PodDisruptionBudget refuses (429) is asked again (kube's client does so itself,
/// with backoff; this loop, a second later, when that gives up). How long each took is printed:
/// the second pod's waits for the first's replacement to be Ready.
async fn drain(client: &Client, ns: &str, name: &str) {
    let budget = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("the PodDisruptionBudget of {name}: {e}"));
    let allowed = budget.status.as_ref().map(|s| s.disruptions_allowed);
    say(&format!(
        "rollouts: drain of {name}: its PodDisruptionBudget allows {allowed:?} disruptions ({:?} of {:?} pods healthy)",
        budget.status.as_ref().map(|s| s.current_healthy),
        budget.status.as_ref().map(|s| s.expected_pods),
    ));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let first: Vec<String> = pods
        .list(&ListParams::default().labels(&cluster_pods(name)))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    for pod in &first {
        let started = Instant::now();
        let deadline = started + WAIT;
        loop {
            match pods.evict(pod, &EvictParams::default()).await {
                Ok(_) => {
                    say(&format!(
                        "rollouts: drain: {pod} evicted {:.1} s after it was asked",
                        started.elapsed().as_secs_f64()
                    ));
                    break;
                }
                Err(kube::Error::Api(status)) if status.code == 429 => {
                    assert!(
                        Instant::now() < deadline,
                        "evicting {pod}: refused until now"
                    );
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => break,
                Err(e) => panic!("evicting {pod}: {e}"),
            }
        }
    }
}

fn seconds(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()))
}

#[tokio::test]
async fn rollouts_drains_and_restarts_under_load_fail_no_request() {
    let Some(mut t) = NodeTest::new("rollouts", Scope::Namespace).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("rollouts").await;
    t.helm_install(
        &ns,
        "rollouts",
        &["--set=singleNamespace.enabled=true".into()],
    )
    .await;
    operator_ready_and_leading(&client, &ns).await;
    apply_origin(&client, &ns, &t.nginx_image).await;
    let origin = ready_pods(&client, &ns, ORIGIN_PODS, 1, WAIT).await[0].name_any();
    for name in ["cache-a", "cache-b"] {
        apply_cluster(&client, &ns, name, cache(2, "1d", "50m")).await;
    }
    apply_cluster(&client, &ns, "edge", balancer("50m")).await;
    for name in ["cache-a", "cache-b", "edge"] {
        cluster_running(&client, &ns, name, WAIT).await;
    }
    let edge = service_address(&client, &ns, "edge", SERVICE_PORT_NAME).await;

    // A new topology, every CdnCluster Running: its first 1,000 requests.
    let fresh = tokio::task::spawn_blocking(move || {
        let mut c = KeepAlive::without_retry(edge, HOST);
        let answers: Vec<String> = (0..1000)
            .map(|i| match c.get(&object(i % OBJECTS), &[]) {
                Ok(r) => r.status.to_string(),
                Err(e) => e.to_string(),
            })
            .collect();
        answers
    })
    .await
    .unwrap();
    let fresh_failed: Vec<&String> = fresh.iter().filter(|a| *a != "200").collect();
    say(&format!(
        "rollouts: a new topology, every CdnCluster Running: {} of its first 1000 requests failed {:?}",
        fresh_failed.len(),
        fresh_failed.iter().take(5).collect::<Vec<_>>(),
    ));

    // Every object cached: asked until a HIT.
    until("the objects cached", WAIT, || async move {
        tokio::task::spawn_blocking(move || {
            let mut c = KeepAlive::new(edge, HOST);
            let missing: Vec<usize> = (0..OBJECTS)
                .filter(|&i| {
                    c.get(&object(i), &[])
                        .map_or(true, |r| r.header(CACHE_STATUS_HEADER) != Some("HIT"))
                })
                .collect();
            missing
                .is_empty()
                .then_some(())
                .ok_or(format!("not yet HITs: {missing:?}"))
        })
        .await
        .unwrap()
    })
    .await;

    let load = Load::start(edge, HOST, (0..OBJECTS).map(object).collect(), CONNECTIONS);
    let counters = load.counters.clone();
    let mut rows: Vec<(String, Snapshot, Duration)> = Vec::new();
    let mut leavings: Vec<(String, Leaving)> = Vec::new();
    macro_rules! event {
        ($what:expr, $body:expr) => {{
            let what: String = $what.into();
            let before = snapshot(&counters, &client, &ns, &origin).await;
            let started = Instant::now();
            $body;
            let took = started.elapsed();
            tokio::time::sleep(SETTLE).await;
            let row = snapshot(&counters, &client, &ns, &origin)
                .await
                .since(&before);
            say(&format!(
                "rollouts: {what}: {} requests, {} failed ({} error status, {} cut, {} refused), {} origin fetches ({:.1} s, then {} s of load)",
                row.requests, row.failed(), row.failed_status, row.cut, row.refused, row.origin,
                took.as_secs_f64(), SETTLE.as_secs(),
            ));
            rows.push((what, row, took));
        }};
    }

    event!("steady load (no event)", {});
    event!("a cache-a pod deleted", {
        let pods = cluster_running(&client, &ns, "cache-a", WAIT).await;
        let leaving = delete_and_follow(&client, &ns, "cache-a", &pods[0]).await;
        leavings.push(("a cache pod (headless Service)".into(), leaving));
        settled(&client, &ns, "cache-a").await;
    });
    event!("an edge pod deleted", {
        let pods = cluster_running(&client, &ns, "edge", WAIT).await;
        let leaving = delete_and_follow(&client, &ns, "edge", &pods[0]).await;
        leavings.push(("a balancer pod (Service with an address)".into(), leaving));
        settled(&client, &ns, "edge").await;
    });
    event!("cache-b lifetime changed (reloaded in place)", {
        apply_cluster(&client, &ns, "cache-b", cache(2, "2d", "50m")).await;
        settled(&client, &ns, "cache-b").await;
    });
    event!("edge rolling update", {
        apply_cluster(&client, &ns, "edge", balancer("60m")).await;
        settled(&client, &ns, "edge").await;
    });
    event!("cache-a rolling update", {
        apply_cluster(&client, &ns, "cache-a", cache(2, "1d", "60m")).await;
        settled(&client, &ns, "cache-a").await;
    });
    event!("cache-b scaled 2 -> 3", {
        apply_cluster(&client, &ns, "cache-b", cache(3, "2d", "50m")).await;
        settled(&client, &ns, "cache-b").await;
    });
    event!(
        "cache-a drained (every pod evicted, PodDisruptionBudget respected)",
        {
            drain(&client, &ns, "cache-a").await;
            settled(&client, &ns, "cache-a").await;
        }
    );
    event!("edge drained", {
        drain(&client, &ns, "edge").await;
        settled(&client, &ns, "edge").await;
    });
    event!("the operator restarted (every replica deleted)", {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        pods.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(OPERATOR_PODS),
        )
        .await
        .unwrap();
        operator_ready_and_leading(&client, &ns).await;
    });

    load.stop().await;
    for (what, leaving) in &leavings {
        say(&format!(
            "rollouts: {what} deleted: not ready in its EndpointSlice after {}, out of kube-proxy's rules after {}, out of the cluster DNS after {}",
            seconds(leaving.endpoint),
            seconds(leaving.kube_proxy),
            seconds(leaving.dns),
        ));
    }
    let samples = counters.samples.lock().unwrap().clone();
    let failed: Vec<&(String, Snapshot, Duration)> =
        rows.iter().filter(|(_, row, _)| row.failed() > 0).collect();
    assert!(
        failed.is_empty(),
        "requests failed during {:?}; the first failures: {samples:#?}",
        failed
            .iter()
            .map(|(w, r, _)| (w, r.failed()))
            .collect::<Vec<_>>()
    );
    assert!(
        fresh_failed.is_empty(),
        "a new topology failed {} of its first 1000 requests",
        fresh_failed.len()
    );
    // A balancer is Ready only once it holds every pod of its caches: neither the new topology
    // (the steady phase follows it) nor a balancer's pods replaced send an object to a cache that
    // does not hold it.
    let fetched: Vec<(&String, usize)> = rows
        .iter()
        .filter(|(what, _, _)| what.starts_with("steady") || what.contains("edge"))
        .map(|(what, row, _)| (what, row.origin))
        .filter(|(_, origin)| *origin > 0)
        .collect();
    assert!(fetched.is_empty(), "objects fetched again: {fetched:?}");
}
