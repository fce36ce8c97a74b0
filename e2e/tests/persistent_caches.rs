//! Caches that survive their pods' replacement, on the node (issue 51, part 2): a 2-replica cache
//! holding 1,000 objects of 60 KiB behind a 2-replica balancer goes through a lifetime change
//! (reloaded in place), a pod deleted, a rolling update and a scale from 2 to 3 pods, first with
//! the default emptyDir, then with `cache.volume` (a StatefulSet, a claim per pod on the node's
//! volumes). A client like wrk (2 keep-alive connections, no retry) asks the popular half of the
//! objects through the balancer's Service all along; after each event has settled, every object
//! is asked once more. The test prints, per event, the requests that failed, the objects the
//! origin served while the event went on (popular ones asked while a pod was away, fetched by the
//! pods that took its share), and those it served again after (what a replaced pod did not keep:
//! the other half, the long tail, is asked only then). Skips with one line, as the
//! node tests do. Run by `e2e/node.sh`, or: `cargo test -p cdn-operator-e2e --test
//! persistent_caches` against the cluster of `e2e/node.sh up`.

use cdn_operator::cdncluster::nginx::SERVICE_PORT_NAME;
use cdn_operator_e2e::node::{
    apply_cluster, apply_origin, cluster_running, local_volumes, operator_ready_and_leading,
    origin_requests_matching, ready_pods, service_address, until, Backing, Load, NodeTest, Scope,
    ORIGIN_BIG_BYTES, ORIGIN_PODS,
};
use cdn_operator_e2e::say;
use cdn_operator_testkit::KeepAlive;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::ResourceExt;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(300);
const OBJECTS: usize = 1000;
/// After an event has settled (every pod Ready, none leaving), the balancers' nginx looks the
/// caches up again (every 5 s) before the objects are asked.
const SETTLE: Duration = Duration::from_secs(10);
const HOST: &str = "cdn.node-e2e.test";
/// The load's connections: enough to ask every popular object within an event, not to saturate
/// the node.
const CONNECTIONS: usize = 2;
/// The objects the load asks: the first half.
const POPULAR: usize = OBJECTS / 2;
/// Volumes of the node's disk, one per claim the run makes (2, the pod deleted keeps its own,
/// the third of the scale), and spares.
const VOLUMES: usize = 4;

fn cache(variant: &Variant, replicas: i32, valid: &str, cpu: &str) -> serde_json::Value {
    let mut cache = json!({"size": "256m", "valid": valid});
    if variant.volume {
        cache["volume"] = json!({"storageClassName": variant.class});
    }
    json!({
        "role": "cache",
        "replicas": replicas,
        "cache": cache,
        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "sources": [{"name": "store", "origin": {"service": {"name": "origin", "port": 8080}}}],
    })
}

fn balancer(source: &str) -> serde_json::Value {
    json!({
        "role": "balancer",
        "replicas": 2,
        "sources": [{"name": source}],
    })
}

/// One run: its cache, its balancer, the prefix of its objects.
struct Variant {
    what: &'static str,
    cache: &'static str,
    edge: &'static str,
    volume: bool,
    class: String,
}

impl Variant {
    fn object(&self, i: usize) -> String {
        format!("/big/{}/{i:04}.ts", self.cache)
    }

    fn prefix(&self) -> String {
        format!("/big/{}/", self.cache)
    }
}

/// Asks every object once through `edge`: the answers that were not the whole object.
async fn sweep(edge: SocketAddr, objects: Vec<String>) -> Vec<String> {
    tokio::task::spawn_blocking(move || {
        let mut c = KeepAlive::new(edge, HOST);
        objects
            .iter()
            .filter_map(|path| match c.get(path, &[]) {
                Ok(r) if r.status == 200 && r.body.len() == ORIGIN_BIG_BYTES => None,
                Ok(r) => Some(format!("GET {path}: {} ({} bytes)", r.status, r.body.len())),
                Err(e) => Some(format!("GET {path}: {e}")),
            })
            .collect()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn caches_with_a_volume_keep_their_objects_through_restarts_rollouts_and_scaling() {
    let Some(mut t) = NodeTest::new("persistent caches", Scope::Namespace).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("volumes").await;
    let class = t.unique("cdn-e2e-local");
    local_volumes(&mut t, &class, VOLUMES, "1Gi", Backing::Disk).await;
    t.helm_install(
        &ns,
        "volumes",
        &["--set=singleNamespace.enabled=true".into()],
    )
    .await;
    operator_ready_and_leading(&client, &ns).await;
    apply_origin(&client, &ns, &t.nginx_image).await;
    let origin = ready_pods(&client, &ns, ORIGIN_PODS, 1, WAIT).await[0].name_any();

    let variants = [
        Variant {
            what: "emptyDir (default)",
            cache: "plain",
            edge: "plain-edge",
            volume: false,
            class: class.clone(),
        },
        Variant {
            what: "cache.volume",
            cache: "kept",
            edge: "kept-edge",
            volume: true,
            class: class.clone(),
        },
    ];
    let mut figures: Vec<(&str, String, usize)> = Vec::new();
    for v in &variants {
        apply_cluster(&client, &ns, v.cache, cache(v, 2, "1d", "50m")).await;
        apply_cluster(&client, &ns, v.edge, balancer(v.cache)).await;
        cluster_running(&client, &ns, v.cache, WAIT).await;
        cluster_running(&client, &ns, v.edge, WAIT).await;
        let edge = service_address(&client, &ns, v.edge, SERVICE_PORT_NAME).await;
        let objects: Vec<String> = (0..OBJECTS).map(|i| v.object(i)).collect();
        let prefix = v.prefix();
        let fetched = || origin_requests_matching(&client, &ns, &origin, &prefix);

        let failed = sweep(edge, objects.clone()).await;
        assert!(failed.is_empty(), "{}: warming: {failed:?}", v.what);
        let warmed = fetched().await;
        let failed = sweep(edge, objects.clone()).await;
        assert!(failed.is_empty(), "{}: {failed:?}", v.what);
        assert_eq!(fetched().await, warmed, "{}: every object cached", v.what);
        say(&format!(
            "persistent caches: {}: {warmed} origin fetches to warm {OBJECTS} objects",
            v.what
        ));

        // The load, all along the events.
        let load = Load::start(edge, HOST, objects[..POPULAR].to_vec(), CONNECTIONS);
        let counters = load.counters.clone();
        // Each event, then every object asked once: what the origin served meanwhile and after.
        let event = |what: &'static str| {
            let before = fetched();
            async move { (what, before.await) }
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        for step in 0..4 {
            let (what, before) = match step {
                0 => {
                    let e = event("lifetime changed (reloaded in place)").await;
                    apply_cluster(&client, &ns, v.cache, cache(v, 2, "2d", "50m")).await;
                    e
                }
                1 => {
                    let e = event("a pod deleted").await;
                    let running = cluster_running(&client, &ns, v.cache, WAIT).await;
                    pods.delete(&running[0].name_any(), &DeleteParams::default())
                        .await
                        .unwrap();
                    // Replaced: the cluster's pods are not the same set until it is.
                    let gone = running[0].name_any();
                    let uid = running[0].uid();
                    until("the pod replaced", WAIT, || {
                        let pods = pods.clone();
                        let (gone, uid) = (gone.clone(), uid.clone());
                        async move {
                            match pods.get_opt(&gone).await.map_err(|e| e.to_string())? {
                                Some(p) if p.uid() == uid => Err(format!("{gone} still there")),
                                _ => Ok(()),
                            }
                        }
                    })
                    .await;
                    e
                }
                2 => {
                    let e = event("rolling update").await;
                    apply_cluster(&client, &ns, v.cache, cache(v, 2, "2d", "60m")).await;
                    e
                }
                _ => {
                    let e = event("scaled 2 -> 3").await;
                    apply_cluster(&client, &ns, v.cache, cache(v, 3, "2d", "60m")).await;
                    e
                }
            };
            cluster_running(&client, &ns, v.cache, WAIT).await;
            tokio::time::sleep(SETTLE).await;
            let during = fetched().await - before;
            let failed = sweep(edge, objects.clone()).await;
            let after = fetched().await - before - during;
            let requests = counters.requests.load(Ordering::Relaxed);
            let load_failed = counters.failed_status.load(Ordering::Relaxed)
                + counters.cut.load(Ordering::Relaxed)
                + counters.refused.load(Ordering::Relaxed);
            say(&format!(
                "persistent caches: {}: {what}: {during} objects fetched while it went on, {after} of {OBJECTS} fetched again after ({requests} requests of the load so far, {load_failed} failed; {} answers of the sweep not whole)",
                v.what,
                failed.len()
            ));
            assert!(failed.is_empty(), "{}: {what}: {failed:?}", v.what);
            figures.push((v.what, what.to_string(), after));
        }
        load.stop().await;
        let samples = counters.samples.lock().unwrap().clone();
        assert!(
            samples.is_empty(),
            "{}: the load's failures: {samples:#?}",
            v.what
        );
        // The next variant runs alone.
        for name in [v.edge, v.cache] {
            let clusters: Api<cdn_operator::api::CdnCluster> = Api::namespaced(client.clone(), &ns);
            clusters
                .delete(name, &DeleteParams::default())
                .await
                .unwrap();
        }
    }

    let kept = |what: &str| {
        figures
            .iter()
            .find(|(variant, event, _)| *variant == "cache.volume" && event == what)
            .map(|(_, _, again)| *again)
            .unwrap()
    };
    // The targets of issue 51: a reload costs nothing; a restarted or rolled pod comes back with
    // its objects (at most 5 % fetched again); a scale moves only the new pod's share, once.
    assert_eq!(kept("lifetime changed (reloaded in place)"), 0);
    assert!(kept("a pod deleted") <= OBJECTS / 20, "{figures:?}");
    assert!(kept("rolling update") <= OBJECTS / 20, "{figures:?}");
    assert!(kept("scaled 2 -> 3") <= OBJECTS / 2, "{figures:?}");
}
