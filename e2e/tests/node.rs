//! cdn-operator on a cluster with a node (issue 39): the operator runs as pods of its own image,
//! installed by Helm or kustomize, and the CDN's nginx pods serve through Services. Each test
//! skips with one line (`node tests skipped: …`) when no API server answers, when no node is
//! Ready, or when `CDN_E2E_OPERATOR_IMAGE` / `CDN_E2E_NGINX_IMAGE` are unset (the test of pods
//! that cannot run: `CDN_E2E_PAUSE_IMAGE` / `CDN_E2E_ROOT_IMAGE` too). Run:
//! `cargo test -p cdn-operator-e2e --test node` (docs/testing.md, the node mode).

use cdn_operator::api::{At, CdnCluster, Outcome, Phase, State};
use cdn_operator::cdncluster::nginx::{CACHE_STATUS_HEADER, LISTEN_PORT, SERVICE_PORT_NAME};
use cdn_operator::kubernetes::events::EVENT_REPORTER;
use cdn_operator_e2e::eventually;
use cdn_operator_e2e::node::{
    answering_upstream, apply_cluster, apply_origin, bind_cluster_role, check_metrics,
    cluster_pods, cluster_running, http_get, lease_holder, operator_ready_and_leading,
    origin_requests, pods_gone, ready_pods, relative_path, run, service_account, service_address,
    until, ImageRef, NodeTest, Scope, LEASE, OPERATOR_PODS, OPERATOR_REPLICAS, ORIGIN_BODY,
    ORIGIN_PODS, ORIGIN_POD_HEADER, PAUSE_IMAGE_ENV, ROOT_IMAGE_ENV,
};
use cdn_operator_e2e::{repository_root, say, USER_MANAGER};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long CdnClusters get to be Running, every pod Ready (images present: seconds; generous
/// for a busy machine).
const WAIT: Duration = Duration::from_secs(240);
/// How long traffic gets to follow a change of the pods behind a name: nginx looks its sources
/// up again every 5 s, the cluster DNS and kube-proxy follow the endpoints within seconds.
const FOLLOW: Duration = Duration::from_secs(90);
/// The Lease's validity after a renewal (docs/operations.md, Leader election: 15 s, as
/// controller-runtime), and the margin a takeover may take beyond it.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const TAKEOVER_MARGIN: Duration = Duration::from_secs(5);
/// The CRDs, which the chart keeps on uninstall and kustomize deletes.
const CRDS: [&str; 2] = [
    "cdnclusters.cluster.anevia.com",
    "ats.cnat.programming-kubernetes.info",
];

/// The pods of `ns` matching `selector` run `image` in their container `container`.
fn assert_image(pods: &[Pod], container: &str, image: &str) {
    for pod in pods {
        let spec = pod.spec.as_ref().expect("a pod spec");
        let found = spec
            .containers
            .iter()
            .find(|c| c.name == container)
            .unwrap_or_else(|| panic!("pod {} has no container {container}", pod.name_any()));
        assert_eq!(
            found.image.as_deref(),
            Some(image),
            "pod {} container {container}",
            pod.name_any()
        );
    }
}

async fn crd_exists(client: &Client, name: &str) -> bool {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(name)
        .await
        .expect("GET the CRD")
        .is_some()
}

#[tokio::test]
async fn helm_installs_the_local_image_elects_a_leader_serves_metrics_through_its_service_and_uninstalls(
) {
    let Some(mut t) = NodeTest::new("helm-install", Scope::Cluster).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("helm").await;
    // The chart's defaults (every namespace, 2 replicas, HTTPS metrics, the uninstall hook) with
    // the local images, and the chart's own binding of its metrics-reader ClusterRole to a
    // ServiceAccount of the test (`metrics.reader`).
    let release = t
        .helm_install(
            &ns,
            "helm",
            &[
                "--set-string=metrics.reader.serviceAccount.name=scraper".into(),
                format!("--set-string=metrics.reader.serviceAccount.namespace={ns}"),
            ],
        )
        .await;
    let (pods, leader) = operator_ready_and_leading(&client, &ns).await;
    assert_image(&pods, "operator", &t.operator_image);
    say(&format!(
        "node helm: release {} in {ns}: {} pods Ready, leader {leader}",
        release.name,
        pods.len()
    ));

    service_account(&client, &ns, "scraper").await;
    service_account(&client, &ns, "stranger").await;
    check_metrics(
        &client,
        &ns,
        &format!("{}-metrics", release.fullname),
        "scraper",
        "stranger",
    )
    .await;

    // `helm uninstall` runs the pre-delete hook Job (`cdn-operator release-finalizers`, the
    // operator's image) and waits for it: a watch sees it complete before Helm deletes it.
    let hook = format!("{}-release-finalizers", release.fullname);
    let succeeded = Arc::new(Mutex::new(None::<i32>));
    let (watching, watched) = tokio::sync::oneshot::channel();
    let watch = {
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        let config = watcher::Config::default().fields(&format!("metadata.name={hook}"));
        let succeeded = succeeded.clone();
        tokio::spawn(async move {
            let mut watching = Some(watching);
            let mut events = std::pin::pin!(watcher(jobs, config));
            while let Some(event) = events.next().await {
                let job = match event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(ready) = watching.take() {
                            let _ = ready.send(());
                        }
                        continue;
                    }
                    Ok(watcher::Event::Apply(job) | watcher::Event::Delete(job)) => job,
                    Ok(watcher::Event::InitApply(job)) => job,
                    Ok(watcher::Event::Init) | Err(_) => continue,
                };
                let count = job.status.and_then(|s| s.succeeded).unwrap_or(0);
                let mut seen = succeeded.lock().unwrap();
                *seen = Some(seen.unwrap_or(0).max(count));
            }
        })
    };
    tokio::time::timeout(Duration::from_secs(30), watched)
        .await
        .expect("the watch of the hook Job started")
        .expect("the watch of the hook Job started");
    let started = Instant::now();
    let output = t.helm_uninstall(&release).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "helm uninstall {} ({}):\n{stdout}\n{}",
        release.name,
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("release \"{}\" uninstalled", release.name)),
        "{stdout}"
    );
    say(&format!(
        "node helm: uninstalled in {:?}",
        started.elapsed()
    ));
    eventually(
        &format!("the hook Job {hook} seen Succeeded"),
        Duration::from_secs(10),
        || std::future::ready(succeeded.lock().unwrap().filter(|n| *n >= 1)),
    )
    .await;
    watch.abort();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    eventually("the operator's Deployment gone", WAIT, || async {
        deployments
            .get_opt(&release.fullname)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let roles: Api<ClusterRole> = Api::all(client.clone());
    for role in [
        release.fullname.clone(),
        format!("{}-metrics-reader", release.fullname),
    ] {
        assert!(
            roles.get_opt(&role).await.expect("GET").is_none(),
            "ClusterRole {role} uninstalled"
        );
    }
    for crd in CRDS {
        assert!(
            crd_exists(&client, crd).await,
            "the CRD {crd} is kept (helm.sh/resource-policy: keep)"
        );
    }
}

#[tokio::test]
async fn kustomize_base_with_the_local_image_runs_elects_a_leader_and_is_deleted() {
    let Some(mut t) = NodeTest::new("kustomize-base", Scope::Cluster).await else {
        return;
    };
    let client = t.client.clone();
    // kustomize/base installs into its own namespace `cdn-operator` under fixed cluster-wide
    // names: the overlay moves it to a namespace and names of this test (`namespace:`,
    // `namePrefix:`; the Lease keeps its name), points `images:` at the local image (repeating
    // the base's `replacements`, which copy it into RELATED_IMAGE_NGINX_METRICS, as
    // docs/install.md says an overlay setting the image must) and sets the nginx image through
    // the Deployment's RELATED_IMAGE_NGINX.
    let ns = t.unique("node-kustomize");
    let prefix = format!("{}-", t.unique("node"));
    let base_dir = repository_root().join("kustomize/base");
    let base: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(base_dir.join("kustomization.yaml")).expect("the base"),
    )
    .expect("the base's kustomization.yaml");
    let shipped_image = base["images"][0]["newName"]
        .as_str()
        .expect("the base's images[0].newName");
    let image = ImageRef::parse(&t.operator_image).expect("checked");
    let mut images = json!({"name": shipped_image, "newName": image.name()});
    if image.digest.is_empty() {
        images["newTag"] = json!(image.tag);
    } else {
        images["digest"] = json!(image.digest);
    }
    let patch = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: cdn-operator\nspec:\n  template:\n    \
         spec:\n      containers:\n        - name: operator\n          env:\n            \
         - name: RELATED_IMAGE_NGINX\n              value: {}\n",
        t.nginx_image
    );
    let overlay = t.dir.path().join("overlay");
    std::fs::create_dir(&overlay).expect("the overlay's directory");
    let relative = relative_path(
        &overlay.canonicalize().expect("the overlay's path"),
        &base_dir.canonicalize().expect("the base's path"),
    );
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "namePrefix": prefix,
        "resources": [relative],
        "images": [images],
        "patches": [{"patch": patch}],
        "replacements": base["replacements"],
    });
    std::fs::write(
        overlay.join("kustomization.yaml"),
        serde_yaml::to_string(&kustomization).expect("YAML"),
    )
    .expect("the overlay");

    // What the overlay renders, before anything is applied.
    let rendered = run(
        Command::new("kubectl").arg("kustomize").arg(&overlay),
        "kubectl kustomize",
    );
    let manifests: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .collect();
    let find = |kind: &str, name: &str| {
        manifests
            .iter()
            .find(|m| m["kind"] == kind && m["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the overlay renders no {kind} {name}:\n{rendered}"))
    };
    let namespace = find("Namespace", &ns);
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let deployment = find("Deployment", &format!("{prefix}cdn-operator"));
    assert_eq!(deployment["metadata"]["namespace"], ns.as_str());
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], t.operator_image.as_str());
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    let env = |name: &str| {
        container["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {container}"))["value"]
            .clone()
    };
    assert_eq!(env("RELATED_IMAGE_NGINX"), t.nginx_image.as_str());
    assert_eq!(
        env("RELATED_IMAGE_NGINX_METRICS"),
        t.operator_image.as_str()
    );

    t.owns_namespace(&ns);
    t.owns_overlay(&overlay);
    run(
        Command::new("kubectl")
            .args(["apply", "--server-side", "-k"])
            .arg(&overlay),
        "kubectl apply --server-side -k",
    );
    let (pods, leader) = operator_ready_and_leading(&client, &ns).await;
    assert_image(&pods, "operator", &t.operator_image);
    say(&format!(
        "node kustomize: {ns}: {} pods Ready, leader {leader}",
        pods.len()
    ));

    service_account(&client, &ns, "scraper").await;
    service_account(&client, &ns, "stranger").await;
    bind_cluster_role(
        &mut t,
        &format!("{prefix}scraper"),
        &format!("{prefix}cdn-operator-metrics-reader"),
        &ns,
        "scraper",
    )
    .await;
    check_metrics(
        &client,
        &ns,
        &format!("{prefix}cdn-operator-metrics"),
        "scraper",
        "stranger",
    )
    .await;

    // `kubectl delete -k`: everything the overlay holds, its namespace and (docs/install.md,
    // Uninstalling) the CRDs with it. No other node test runs meanwhile (Scope::Cluster); the
    // next one installs them again.
    let started = Instant::now();
    run(
        Command::new("kubectl")
            .args(["delete", "--timeout=5m", "-k"])
            .arg(&overlay),
        "kubectl delete -k",
    );
    t.deleted_overlay(&overlay);
    say(&format!(
        "node kustomize: deleted in {:?}",
        started.elapsed()
    ));
    let roles: Api<ClusterRole> = Api::all(client.clone());
    assert!(roles
        .get_opt(&format!("{prefix}cdn-operator"))
        .await
        .expect("GET")
        .is_none());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    eventually(&format!("namespace {ns} gone"), WAIT, || async {
        namespaces.get_opt(&ns).await.ok()?.is_none().then_some(())
    })
    .await;
    for crd in CRDS {
        eventually(
            &format!("the CRD {crd} deleted with the install"),
            Duration::from_secs(60),
            || async { (!crd_exists(&client, crd).await).then_some(()) },
        )
        .await;
    }
}

#[tokio::test]
async fn the_leader_pod_deleted_the_other_replica_takes_the_lease_within_its_duration() {
    let Some(mut t) = NodeTest::new("failover", Scope::Namespace).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("failover").await;
    // The chart's default replicas (2), managing its own namespace.
    let release = t
        .helm_install(
            &ns,
            "failover",
            &["--set=singleNamespace.enabled=true".into()],
        )
        .await;
    let deployment: Deployment = Api::namespaced(client.clone(), &ns)
        .get(&release.fullname)
        .await
        .expect("the operator's Deployment");
    assert_eq!(
        deployment.spec.and_then(|s| s.replicas),
        Some(OPERATOR_REPLICAS as i32),
        "the chart's default replicaCount"
    );
    let (pods, leader) = operator_ready_and_leading(&client, &ns).await;
    assert_eq!(pods.len(), OPERATOR_REPLICAS);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let deleted = Instant::now();
    pods_api
        .delete(&leader, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the leader pod {leader}: {e}"));
    let new_leader = eventually(
        &format!("a pod other than {leader} holding Lease {LEASE}"),
        Duration::from_secs(120),
        || async {
            let holder = lease_holder(&client, &ns, LEASE)
                .await
                .filter(|h| *h != leader)?;
            let pod = pods_api.get_opt(&holder).await.ok()??;
            let operator =
                pod.labels().get("app.kubernetes.io/component") == Some(&"operator".to_string());
            (operator && pod.metadata.deletion_timestamp.is_none()).then_some(holder)
        },
    )
    .await;
    let takeover = deleted.elapsed();
    say(&format!(
        "node failover: {new_leader} took the Lease {takeover:?} after the leader pod {leader} was deleted"
    ));
    assert!(
        takeover <= LEASE_DURATION + TAKEOVER_MARGIN,
        "takeover in {takeover:?}: more than the lease duration {LEASE_DURATION:?} + {TAKEOVER_MARGIN:?}"
    );

    // The Deployment replaces the pod; the new leader keeps the Lease and reconciles.
    ready_pods(&client, &ns, OPERATOR_PODS, OPERATOR_REPLICAS, WAIT).await;
    eventually(&format!("the deleted pod {leader} gone"), WAIT, || async {
        pods_api
            .get_opt(&leader)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        lease_holder(&client, &ns, LEASE).await.as_deref(),
        Some(new_leader.as_str())
    );
    apply_cluster(
        &client,
        &ns,
        "after-failover",
        json!({"role": "cache", "cache": {"size": "64m"}, "sources": []}),
    )
    .await;
    let clusters: Api<CdnCluster> = Api::namespaced(client.clone(), &ns);
    eventually(
        "after-failover deployed by the new leader",
        WAIT,
        || async {
            let cluster = clusters.get_opt("after-failover").await.ok()??;
            let status = cluster.status?;
            let current = status.observed_generation == cluster.metadata.generation;
            status
                .state
                .filter(|s| current && matches!(s, State::Deploying | State::Running))
        },
    )
    .await;
}

/// A cache of the pool: one replica, a small cache (its emptyDir and ephemeral-storage request
/// follow `cache.size`), fetching from the origin Service.
fn pool_cache() -> serde_json::Value {
    json!({
        "role": "cache",
        "replicas": 1,
        "cache": {"size": "256m"},
        "sources": [{"name": "store", "origin": {"service": {"name": "origin", "port": 8080}}}],
    })
}

/// GETs each of `urls` through the balancer at `edge`: the responses when every one is 200 with
/// the origin's body, else what failed first.
async fn serve_all(
    edge: std::net::SocketAddr,
    urls: &[String],
) -> Result<Vec<cdn_operator_testkit::Response>, String> {
    let mut responses = Vec::new();
    for url in urls {
        let response = http_get(edge, url)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if response.status != 200 || response.body != ORIGIN_BODY {
            return Err(format!("GET {url}: {response:?}"));
        }
        responses.push(response);
    }
    Ok(responses)
}

fn members(responses: &[cdn_operator_testkit::Response]) -> BTreeSet<String> {
    responses.iter().filter_map(answering_upstream).collect()
}

fn pod_address(pod: &Pod) -> String {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_else(|| panic!("pod {} has no IP", pod.name_any()));
    format!("{ip}:{LISTEN_PORT}")
}

#[tokio::test]
async fn a_balancer_a_pool_of_two_caches_and_an_origin_serve_miss_then_hit_and_follow_recreated_sources(
) {
    let Some(mut t) = NodeTest::new("cdn", Scope::Namespace).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("cdn").await;
    t.helm_install(&ns, "cdn", &["--set=singleNamespace.enabled=true".into()])
        .await;
    operator_ready_and_leading(&client, &ns).await;

    // origin ← cache-1, cache-2 (a pool: no pathCondition) ← edge; and cache-live, whose origin
    // name does not resolve, on ^/live/: its nginx must start and be Ready all the same.
    apply_origin(&client, &ns, &t.nginx_image).await;
    for cache in ["cache-1", "cache-2"] {
        apply_cluster(&client, &ns, cache, pool_cache()).await;
    }
    apply_cluster(
        &client,
        &ns,
        "cache-live",
        json!({
            "role": "cache",
            "cache": {"size": "256m"},
            "sources": [{"name": "live-origin", "origin": {"url": "http://live.example.com:8080/hls"}}],
        }),
    )
    .await;
    apply_cluster(
        &client,
        &ns,
        "edge",
        json!({
            "role": "balancer",
            "replicas": 1,
            "sources": [
                {"name": "cache-live", "pathCondition": "^/live/"},
                {"name": "cache-1"},
                {"name": "cache-2"},
            ],
        }),
    )
    .await;
    let origin = ready_pods(&client, &ns, ORIGIN_PODS, 1, WAIT).await[0].name_any();
    for name in ["cache-1", "cache-2", "cache-live", "edge"] {
        let pods = cluster_running(&client, &ns, name, WAIT).await;
        assert_image(&pods, "nginx", &t.nginx_image);
    }
    let edge = service_address(&client, &ns, "edge", SERVICE_PORT_NAME).await;

    // Through the balancer's Service: the first answer once the names resolve.
    let started = Instant::now();
    until("the balancer serving the origin's body", FOLLOW, || async {
        serve_all(edge, &["/vod/warm-up.ts".to_string()]).await
    })
    .await;
    say(&format!(
        "node cdn: first answer through {edge} {:?} after every pod was Ready",
        started.elapsed()
    ));

    // A MISS fetched from the origin, then a HIT that does not reach it.
    let path = "/vod/a.ts";
    let miss = http_get(edge, path).await.expect("GET /vod/a.ts");
    assert_eq!(
        (miss.status, miss.body.as_str()),
        (200, ORIGIN_BODY),
        "{miss:?}"
    );
    assert_eq!(miss.header(CACHE_STATUS_HEADER), Some("MISS"), "{miss:?}");
    assert_eq!(
        miss.header(ORIGIN_POD_HEADER),
        Some(origin.as_str()),
        "{miss:?}"
    );
    let member = answering_upstream(&miss).expect("X-Cdn-Upstream on a pool's answer");
    until(
        "the origin's log of the MISS: one request",
        Duration::from_secs(20),
        || async {
            match origin_requests(&client, &ns, &origin, path).await {
                1 => Ok(()),
                n => Err(format!("{n} requests for {path} in the logs of {origin}")),
            }
        },
    )
    .await;
    let hit = http_get(edge, path).await.expect("GET /vod/a.ts again");
    assert_eq!(
        (hit.status, hit.body.as_str()),
        (200, ORIGIN_BODY),
        "{hit:?}"
    );
    assert_eq!(hit.header(CACHE_STATUS_HEADER), Some("HIT"), "{hit:?}");
    assert_eq!(
        answering_upstream(&hit).as_deref(),
        Some(member.as_str()),
        "one URI, one member of the pool"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        origin_requests(&client, &ns, &origin, path).await,
        1,
        "the HIT did not reach the origin"
    );

    // The live route: nginx runs without its origin's address and answers an error at once.
    let live = http_get(edge, "/live/index.m3u8")
        .await
        .expect("GET /live/index.m3u8");
    assert!(
        matches!(live.status, 502 | 504),
        "an origin that does not resolve: {live:?}"
    );

    // A source re-created: the cache that served /vod/a.ts deleted, then created again.
    let mut caches = Vec::new();
    for name in ["cache-1", "cache-2"] {
        let pods = ready_pods(&client, &ns, &cluster_pods(name), 1, WAIT).await;
        caches.push((name, pod_address(&pods[0])));
    }
    let (gone, kept) = if caches[0].1 == member {
        (caches[0].clone(), caches[1].clone())
    } else {
        assert_eq!(
            caches[1].1, member,
            "the member {member} is a cache of the pool: {caches:?}"
        );
        (caches[1].clone(), caches[0].clone())
    };
    let clusters: Api<CdnCluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .delete(gone.0, &DeleteParams::background())
        .await
        .unwrap_or_else(|e| panic!("deleting {}: {e}", gone.0));
    pods_gone(&client, &ns, &cluster_pods(gone.0), WAIT).await;
    // Meanwhile the pool fails over to the member left.
    let during: Vec<String> = (0..8).map(|i| format!("/vod/during-{i}.ts")).collect();
    let started = Instant::now();
    until(
        &format!("every path served by {} while {} is gone", kept.0, gone.0),
        FOLLOW,
        || async {
            let responses = serve_all(edge, &during).await?;
            let seen = members(&responses);
            (seen == BTreeSet::from([kept.1.clone()]))
                .then_some(())
                .ok_or(format!("members {seen:?}"))
        },
    )
    .await;
    say(&format!(
        "node cdn: {} alone serves the pool {:?} after {} went",
        kept.0,
        started.elapsed(),
        gone.0
    ));
    let recreated = Instant::now();
    apply_cluster(&client, &ns, gone.0, pool_cache()).await;
    let new_pods = cluster_running(&client, &ns, gone.0, WAIT).await;
    let running = recreated.elapsed();
    let new_member = pod_address(&new_pods[0]);
    let follow: Vec<String> = (0..16).map(|i| format!("/vod/follow-{i}.ts")).collect();
    until(
        &format!("the pool through the re-created {} ({new_member})", gone.0),
        FOLLOW,
        || async {
            let responses = serve_all(edge, &follow).await?;
            let seen = members(&responses);
            let expected = BTreeSet::from([kept.1.clone(), new_member.clone()]);
            (seen == expected)
                .then_some(())
                .ok_or(format!("members {seen:?}, expected {expected:?}"))
        },
    )
    .await;
    say(&format!(
        "node cdn: re-created {} Running in {running:?}, serving through the balancer in {:?}",
        gone.0,
        recreated.elapsed()
    ));
    cluster_running(&client, &ns, "edge", WAIT).await;

    // The origin re-created (a new pod, a new ClusterIP): both caches fetch from it.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    deployments
        .delete("origin", &DeleteParams::background())
        .await
        .expect("deleting Deployment origin");
    services
        .delete("origin", &DeleteParams::default())
        .await
        .expect("deleting Service origin");
    pods_gone(&client, &ns, ORIGIN_PODS, WAIT).await;
    eventually("Service origin gone", WAIT, || async {
        services
            .get_opt("origin")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let recreated = Instant::now();
    apply_origin(&client, &ns, &t.nginx_image).await;
    let new_origin = ready_pods(&client, &ns, ORIGIN_PODS, 1, WAIT).await[0].name_any();
    let mut round = 0;
    until(
        "the caches fetching from the re-created origin",
        FOLLOW,
        || {
            round += 1;
            let fresh: Vec<String> = (0..16)
                .map(|i| format!("/vod/origin-{round}-{i}.ts"))
                .collect();
            let new_origin = new_origin.clone();
            async move {
                let responses = serve_all(edge, &fresh).await?;
                for response in &responses {
                    let fetched = response.header(CACHE_STATUS_HEADER) == Some("MISS")
                        && response.header(ORIGIN_POD_HEADER) == Some(new_origin.as_str());
                    if !fetched {
                        return Err(format!("not a MISS from {new_origin}: {response:?}"));
                    }
                }
                let seen = members(&responses);
                (seen.len() == 2)
                    .then_some(())
                    .ok_or(format!("only {seen:?} of the pool answered"))
            }
        },
    )
    .await;
    say(&format!(
        "node cdn: the caches fetch from the re-created origin {new_origin} {:?} after it was applied",
        recreated.elapsed()
    ));
}

#[tokio::test]
async fn the_seed_examples_run_on_pods_under_restricted_pod_security() {
    let Some(mut t) = NodeTest::new("seed", Scope::Namespace).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("seed").await;
    t.helm_install(&ns, "seed", &["--set=singleNamespace.enabled=true".into()])
        .await;
    operator_ready_and_leading(&client, &ns).await;
    // Unchanged, as the README's quick start applies them.
    let seeds = repository_root().join("e2e/fixtures/seed-examples");
    run(
        Command::new("kubectl")
            .args(["apply", "-n", &ns, "-f"])
            .arg(&seeds),
        "kubectl apply -f seed-examples/",
    );
    for name in ["balancer", "cache-live", "cache-vod"] {
        let pods = cluster_running(&client, &ns, name, WAIT).await;
        assert_image(&pods, "nginx", &t.nginx_image);
    }
    // The seed's At (`echo YAY`, a schedule in the past) runs at once.
    at_done_in_a_pod(&client, &ns, "example-at", "YAY", &t.nginx_image).await;
}

/// At `name` of `ns` ends DONE, Succeeded; its pod `<name>-pod` ran `image` to Succeeded and its
/// logs (`pods/log`) hold `output`.
async fn at_done_in_a_pod(client: &Client, ns: &str, name: &str, output: &str, image: &str) {
    let ats: Api<At> = Api::namespaced(client.clone(), ns);
    let status = eventually(&format!("At {ns}/{name} DONE"), WAIT, || async {
        let status = ats.get_opt(name).await.ok()??.status?;
        (status.phase == Some(Phase::Done)).then_some(status)
    })
    .await;
    assert_eq!(status.outcome, Some(Outcome::Succeeded), "{status:?}");
    let pod_name = format!("{name}-pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = pods
        .get(&pod_name)
        .await
        .unwrap_or_else(|e| panic!("pod {pod_name}: {e}"));
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded"),
        "{:?}",
        pod.status
    );
    assert_image(&[pod], "busybox", image);
    let logs = pods
        .logs(&pod_name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("the logs of {pod_name}: {e}"));
    assert!(
        logs.contains(output),
        "pod {pod_name} printed {logs:?}, not {output:?}"
    );
}

#[tokio::test]
async fn an_at_runs_its_command_in_a_pod_whose_logs_hold_the_output() {
    let Some(mut t) = NodeTest::new("at", Scope::Namespace).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("at").await;
    t.helm_install(&ns, "at", &["--set=singleNamespace.enabled=true".into()])
        .await;
    operator_ready_and_leading(&client, &ns).await;
    let token = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos()
            ^ u128::from(std::process::id())
    );
    let output = format!("node-e2e-{token}");
    let at: At = serde_json::from_value(json!({
        "apiVersion": "cnat.programming-kubernetes.info/v1alpha1", "kind": "At",
        "metadata": {"name": "token"},
        "spec": {"schedule": "2019-04-12T10:12:00Z", "command": format!("echo {output}")},
    }))
    .expect("an At");
    Api::<At>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &at)
        .await
        .expect("creating the At");
    at_done_in_a_pod(&client, &ns, "token", &output, &t.nginx_image).await;
}

/// How long pods that cannot run get to say why (an image pull to fail, a first crash and its
/// back-off, the scheduler's verdict: seconds; generous for a busy machine).
const PROBLEM_WAIT: Duration = Duration::from_secs(240);
/// How long the test watches pods that still cannot run for a status write at least: the
/// kubelet retries meanwhile (a pull, a restart of the crash loop).
const QUIET: Duration = Duration::from_secs(45);
/// How long it waits, beyond [`QUIET`], for the crash loop's next restart (the kubelet's back-off
/// doubles from 10 s to 5 min).
const NEXT_RESTART: Duration = Duration::from_secs(330);
/// An image no registry has (none is reachable): the kubelet alternates `ErrImagePull` and
/// `ImagePullBackOff`.
const MISSING_IMAGE: &str = "localhost/does-not-exist:1.30";
const AT_MISSING_IMAGE: &str = "localhost/does-not-exist:1";

/// A CdnCluster whose pods cannot run, and what its `Ready` condition must say.
struct CannotRun {
    name: &'static str,
    /// The spec's fields beyond role, replicas and sources.
    extra: serde_json::Value,
    reason: &'static str,
    /// What the message must be (docs/cdncluster.md, Why replicas do not run).
    expected: &'static str,
    message_fits: fn(&str) -> bool,
}

/// A cache of one replica fetching from a URL origin (never fetched from: no pod runs), with
/// `extra` fields.
fn cache_with(extra: &serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "role": "cache",
        "replicas": 1,
        "sources": [{"name": "o", "origin": {"url": "http://origin.example:8080"}}],
    });
    for (field, value) in extra.as_object().expect("fields") {
        spec[field] = value.clone();
    }
    spec
}

/// The condition `type_` of `conditions`: (status, reason, message).
fn condition_of(
    conditions: &[cdn_operator::api::Condition],
    type_: &str,
) -> Option<(String, String, String)> {
    let c = conditions.iter().find(|c| c.type_ == type_)?;
    Some((
        c.status.to_string(),
        c.reason.to_string(),
        c.message.to_string(),
    ))
}

async fn cluster_condition(
    clusters: &Api<CdnCluster>,
    name: &str,
    type_: &str,
) -> Result<(String, String, String), String> {
    let cluster = clusters
        .get_opt(name)
        .await
        .map_err(|e| format!("GET {name}: {e}"))?
        .ok_or(format!("no CdnCluster {name}"))?;
    let status = cluster.status.ok_or("no status yet")?;
    condition_of(&status.conditions, type_).ok_or(format!("no {type_} condition yet"))
}

/// The Warning Events the operator published in `ns`, by the kind and name of their object.
async fn operator_warnings(client: &Client, ns: &str) -> Vec<(String, String, Event)> {
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing the Events of {ns}: {e}"));
    events
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some(EVENT_REPORTER))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            let regarding = e.regarding.clone().unwrap_or_default();
            (
                regarding.kind.unwrap_or_default(),
                regarding.name.unwrap_or_default(),
                e,
            )
        })
        .collect()
}

/// The operator said of `kind` `name` exactly one Warning: one Event object with `reason` and
/// `note`, published once (no series, or a series of one: a repeat would count in it).
async fn one_warning(client: &Client, ns: &str, kind: &str, name: &str, reason: &str, note: &str) {
    let about: Vec<Event> = operator_warnings(client, ns)
        .await
        .into_iter()
        .filter(|(k, n, _)| k == kind && n == name)
        .map(|(_, _, e)| e)
        .collect();
    let said: Vec<(Option<&str>, Option<&str>, Option<i32>)> = about
        .iter()
        .map(|e| {
            (
                e.reason.as_deref(),
                e.note.as_deref(),
                e.series.as_ref().map(|s| s.count),
            )
        })
        .collect();
    assert_eq!(
        said.len(),
        1,
        "one Warning about {kind} {name}, {reason}: {said:#?}"
    );
    assert_eq!(
        (said[0].0, said[0].1),
        (Some(reason), Some(note)),
        "the Warning about {kind} {name}"
    );
    assert!(
        said[0].2.is_none_or(|count| count <= 1),
        "the Warning about {kind} {name} was published again: {:?}",
        about[0].series
    );
}

/// The REASON column of `kubectl get cdn -n <ns>`, by CdnCluster.
fn reason_column(ns: &str) -> std::collections::BTreeMap<String, String> {
    let table = run(
        Command::new("kubectl").args(["get", "cdn", "-n", ns]),
        "kubectl get cdn",
    );
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let column = header
        .iter()
        .position(|h| *h == "REASON")
        .unwrap_or_else(|| panic!("no REASON column in `kubectl get cdn`:\n{table}"));
    lines
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .map(|cells| {
            let reason = cells.get(column).copied().unwrap_or_default();
            (cells[0].to_string(), reason.to_string())
        })
        .collect()
}

/// The restarts of the nginx container of the pods of CdnCluster `name`.
async fn nginx_restarts(client: &Client, ns: &str, name: &str) -> i32 {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&cluster_pods(name)))
        .await
        .unwrap_or_else(|e| panic!("the pods of {name}: {e}"));
    pods.items
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter(|c| c.name == "nginx")
        .map(|c| c.restart_count)
        .sum()
}

/// Issue 41 on a kubelet and a scheduler: pods that cannot run, for four reasons, and an At's pod
/// whose image does not exist. Each object's Ready says why, once (no write while the kubelet
/// retries), with one Warning; a progress deadline makes the cluster Stalled; a fixed image makes
/// it Running with no new Warning.
#[tokio::test]
async fn pods_that_cannot_run_are_the_ready_reason_once_with_one_warning_until_fixed() {
    let Some(mut t) = NodeTest::new("cannot-run", Scope::Namespace).await else {
        return;
    };
    let Some(pause_image) = t.extra_image(PAUSE_IMAGE_ENV) else {
        return;
    };
    let Some(root_image) = t.extra_image(ROOT_IMAGE_ENV) else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("cannot-run").await;
    t.helm_install(
        &ns,
        "cannot-run",
        &["--set=singleNamespace.enabled=true".into()],
    )
    .await;
    operator_ready_and_leading(&client, &ns).await;

    let cases = [
        CannotRun {
            name: "crash",
            // busybox without nginx: the entrypoint says so in one line and exits 127.
            extra: json!({"image": pause_image}),
            reason: "CrashLoopBackOff",
            expected:
                "container nginx exits with code 127: cdn-operator: nginx: not found in this image",
            message_fits: |m| {
                m == "container nginx exits with code 127: cdn-operator: nginx: not found in this image"
            },
        },
        CannotRun {
            name: "nopull",
            extra: json!({"image": MISSING_IMAGE}),
            reason: "ImagePullBackOff",
            expected: "image localhost/does-not-exist:1.30 of container nginx cannot be pulled",
            message_fits: |m| {
                m == "image localhost/does-not-exist:1.30 of container nginx cannot be pulled"
            },
        },
        CannotRun {
            name: "rootimage",
            // Refused by the kubelet under the pods' runAsNonRoot.
            extra: json!({"image": root_image}),
            reason: "CreateContainerConfigError",
            expected: "container nginx cannot start: <the kubelet's words on runAsNonRoot>",
            message_fits: |m| {
                m.starts_with("container nginx cannot start: ") && m.contains("runAsNonRoot")
            },
        },
        CannotRun {
            name: "unschedulable",
            extra: json!({"resources": {"requests": {"cpu": "64"}}}),
            reason: "Unschedulable",
            expected: "no node can run the pod: <the scheduler's first sentence, Insufficient cpu>",
            message_fits: |m| {
                m.starts_with("no node can run the pod: ") && m.contains("Insufficient cpu")
            },
        },
    ];
    for case in &cases {
        apply_cluster(&client, &ns, case.name, cache_with(&case.extra)).await;
    }
    let at_name = "at-nopull";
    let at: At = serde_json::from_value(json!({
        "apiVersion": "cnat.programming-kubernetes.info/v1alpha1", "kind": "At",
        "metadata": {"name": at_name},
        "spec": {"schedule": "2019-04-12T10:12:00Z", "command": "echo never", "image": AT_MISSING_IMAGE},
    }))
    .expect("an At");
    let ats: Api<At> = Api::namespaced(client.clone(), &ns);
    ats.create(&PostParams::default(), &at)
        .await
        .expect("creating the At");

    // Each CdnCluster's Ready says why its pod does not run, and one Warning says it too.
    let clusters: Api<CdnCluster> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    let mut messages = Vec::new();
    for case in &cases {
        let message = until(
            &format!(
                "CdnCluster {} Ready False, {}: {}",
                case.name, case.reason, case.expected
            ),
            PROBLEM_WAIT,
            || async {
                let (status, reason, message) =
                    cluster_condition(&clusters, case.name, "Ready").await?;
                let fits =
                    status == "False" && reason == case.reason && (case.message_fits)(&message);
                fits.then_some(message.clone())
                    .ok_or(format!("Ready {status}, {reason}: {message}"))
            },
        )
        .await;
        say(&format!(
            "node cannot-run: {} Ready False, {} {:?} after creation: {message}",
            case.name,
            case.reason,
            started.elapsed()
        ));
        messages.push(message);
    }
    let at_message = format!(
        "Pod {at_name}-pod: image {AT_MISSING_IMAGE} of container busybox cannot be pulled"
    );
    until(
        &format!("At {at_name} Ready False, ImagePullBackOff: {at_message}"),
        PROBLEM_WAIT,
        || async {
            let at = ats
                .get_opt(at_name)
                .await
                .map_err(|e| format!("GET: {e}"))?
                .ok_or("no At")?;
            let status = at.status.ok_or("no status yet")?;
            let (status, reason, message) =
                condition_of(&status.conditions, "Ready").ok_or("no Ready condition yet")?;
            (status == "False" && reason == "ImagePullBackOff" && message == at_message)
                .then_some(())
                .ok_or(format!("Ready {status}, {reason}: {message}"))
        },
    )
    .await;

    // One Warning per problem and object (it follows the status write: waited for).
    let mut warned: Vec<(&str, &str, &str, String)> = cases
        .iter()
        .zip(&messages)
        .map(|(case, message)| ("CdnCluster", case.name, case.reason, message.clone()))
        .collect();
    warned.push(("At", at_name, "ImagePullBackOff", at_message.clone()));
    for (kind, name, reason, note) in &warned {
        eventually(
            &format!("a Warning {reason} about {kind} {name}"),
            Duration::from_secs(30),
            || async {
                operator_warnings(&client, &ns)
                    .await
                    .iter()
                    .any(|(k, n, e)| k == kind && n == name && e.reason.as_deref() == Some(reason))
                    .then_some(())
            },
        )
        .await;
        one_warning(&client, &ns, kind, name, reason, note).await;
    }

    // `kubectl get cdn` shows each reason.
    let column = reason_column(&ns);
    for case in &cases {
        assert_eq!(
            column.get(case.name).map(String::as_str),
            Some(case.reason),
            "REASON of {} in `kubectl get cdn -n {ns}`: {column:?}",
            case.name
        );
    }

    // The problems stay the same while the kubelet retries (a pull, the crash loop's next
    // restart, the scheduler): no status write, no second Warning.
    let versions = |names: Vec<&'static str>| {
        let (clusters, ats) = (clusters.clone(), ats.clone());
        async move {
            let mut versions = Vec::new();
            for name in names {
                let cluster = clusters.get(name).await.expect("GET the CdnCluster");
                versions.push((name, cluster.resource_version()));
            }
            let at = ats.get(at_name).await.expect("GET the At");
            versions.push((at_name, at.resource_version()));
            versions
        }
    };
    let names: Vec<&'static str> = cases.iter().map(|c| c.name).collect();
    let before = versions(names.clone()).await;
    let restarts = nginx_restarts(&client, &ns, "crash").await;
    let quiet = Instant::now();
    tokio::time::sleep(QUIET).await;
    eventually(
        &format!("a restart of crash's nginx after its {restarts}"),
        NEXT_RESTART,
        || async { (nginx_restarts(&client, &ns, "crash").await > restarts).then_some(()) },
    )
    .await;
    let after = versions(names).await;
    say(&format!(
        "node cannot-run: no status write in {:?} (crash's nginx restarted {} → {} times)",
        quiet.elapsed(),
        restarts,
        nginx_restarts(&client, &ns, "crash").await
    ));
    assert_eq!(
        after, before,
        "resourceVersions after the kubelet's retries"
    );
    for (kind, name, reason, note) in &warned {
        one_warning(&client, &ns, kind, name, reason, note).await;
    }

    // The rollout past its progress deadline (a field the operator leaves to others): Stalled,
    // the pods' reason unchanged in Ready, and no other Warning.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .patch(
            "nopull-deployment",
            &PatchParams {
                field_manager: Some(USER_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"progressDeadlineSeconds": 15}})),
        )
        .await
        .expect("patching nopull-deployment's progressDeadlineSeconds");
    let message_of = |name: &str| {
        let at = cases.iter().position(|c| c.name == name).expect("a case");
        messages[at].clone()
    };
    let nopull_message = &message_of("nopull");
    until(
        "nopull Stalled True, ProgressDeadlineExceeded",
        PROBLEM_WAIT,
        || async {
            let (status, reason, message) =
                cluster_condition(&clusters, "nopull", "Stalled").await?;
            (status == "True" && reason == "ProgressDeadlineExceeded" && message == *nopull_message)
                .then_some(())
                .ok_or(format!("Stalled {status}, {reason}: {message}"))
        },
    )
    .await;
    assert_eq!(
        cluster_condition(&clusters, "nopull", "Ready").await,
        Ok((
            "False".into(),
            "ImagePullBackOff".into(),
            nopull_message.clone()
        ))
    );
    assert_eq!(
        cluster_condition(&clusters, "nopull", "Reconciling")
            .await
            .map(|(status, reason, _)| (status, reason)),
        Ok(("False".into(), "ImagePullBackOff".into()))
    );
    let deadline = deployments
        .get("nopull-deployment")
        .await
        .expect("GET nopull-deployment")
        .spec
        .and_then(|s| s.progress_deadline_seconds);
    assert_eq!(
        deadline,
        Some(15),
        "the operator left progressDeadlineSeconds alone"
    );
    one_warning(
        &client,
        &ns,
        "CdnCluster",
        "nopull",
        "ImagePullBackOff",
        nopull_message,
    )
    .await;

    // crash fixed: its image is nginx. Running, Ready, and no new Warning.
    apply_cluster(
        &client,
        &ns,
        "crash",
        cache_with(&json!({"image": t.nginx_image})),
    )
    .await;
    let pods = cluster_running(&client, &ns, "crash", WAIT).await;
    assert_image(&pods, "nginx", &t.nginx_image);
    let (status, reason, _) = cluster_condition(&clusters, "crash", "Ready")
        .await
        .expect("crash's Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Running"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let crash_message = message_of("crash");
    one_warning(
        &client,
        &ns,
        "CdnCluster",
        "crash",
        "CrashLoopBackOff",
        &crash_message,
    )
    .await;
    assert_eq!(
        reason_column(&ns).get("crash").map(String::as_str),
        Some("Running")
    );
}

/// Percentile `q` of sorted `values`.
fn percentile(values: &[f64], q: f64) -> f64 {
    values[((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1]
}

/// Issue 49 on pods: an origin ← `shield` ← the pool `cache-1` + `cache-2` (2 pods each) ←
/// `edge`, the operator as pods of its image (Helm). Under load (threads asking the objects no
/// purge names, through the balancer's Service), 1,000 CdnPurges are written at once, a path
/// each: for each, the time from its write until the balancer serves the object's new version;
/// once all are Complete, no purged object is served stale, and the load's objects stayed hits.
/// Then one purge of 10,000 objects by surrogate key: the time from its write until Complete.
/// The figures are printed; the test asserts what they must show (no stale body, the hits, every
/// purge complete), not times.
#[tokio::test]
async fn purges_reach_every_cache_pod_within_seconds_under_load() {
    use cdn_operator::api::{CdnPurge, PurgePhase};
    use cdn_operator_testkit::KeepAlive;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const PURGED: usize = 1000;
    const KEPT: usize = 1000;
    const BULK: usize = 10_000;
    const OTHER: usize = 1000;
    let Some(mut t) = NodeTest::new("purge", Scope::Namespace).await else {
        return;
    };
    let client = t.client.clone();
    let ns = t.namespace("purge").await;
    t.helm_install(&ns, "purge", &["--set=singleNamespace.enabled=true".into()])
        .await;
    operator_ready_and_leading(&client, &ns).await;
    apply_origin(&client, &ns, &t.nginx_image).await;
    let cache = |replicas: i32, source: serde_json::Value| json!({"role": "cache", "replicas": replicas, "cache": {"size": "256m"}, "sources": [source]});
    apply_cluster(
        &client,
        &ns,
        "shield",
        cache(
            1,
            json!({"name": "store", "origin": {"service": {"name": "origin", "port": 8080}}}),
        ),
    )
    .await;
    for name in ["cache-1", "cache-2"] {
        apply_cluster(&client, &ns, name, cache(2, json!({"name": "shield"}))).await;
    }
    apply_cluster(
        &client,
        &ns,
        "edge",
        json!({"role": "balancer", "replicas": 1, "sources": [{"name": "cache-1"}, {"name": "cache-2"}]}),
    )
    .await;
    for name in ["shield", "cache-1", "cache-2", "edge"] {
        cluster_running(&client, &ns, name, WAIT).await;
    }
    let edge = service_address(&client, &ns, "edge", SERVICE_PORT_NAME).await;
    until("the balancer serving the origin", FOLLOW, || async {
        let r = http_get(edge, "/pv/warm-up")
            .await
            .map_err(|e| e.to_string())?;
        (r.status == 200).then_some(()).ok_or(format!("{r:?}"))
    })
    .await;
    // Every pod of the pool serves before the objects are placed on the ring.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let pv = |i: usize| format!("/pv/{i:04}");
    let bulk = |i: usize| format!("/pt/bulk/{i:05}");
    let other = |i: usize| format!("/pt/other/{i:04}");
    let all: Vec<String> = (0..PURGED + KEPT)
        .map(pv)
        .chain((0..BULK).map(bulk))
        .chain((0..OTHER).map(other))
        .collect();
    let warmed = tokio::task::spawn_blocking({
        let all = all.clone();
        move || {
            std::thread::scope(|s| {
                let workers: Vec<_> = all
                    .chunks(all.len().div_ceil(8))
                    .map(|part| {
                        s.spawn(move || {
                            let mut c = KeepAlive::new(edge, "cdn.node-e2e.test");
                            // Twice: a MISS, then a HIT that says it is cached.
                            part.iter()
                                .filter(|p| {
                                    let _ = c.get(p, &[]);
                                    c.get(p, &[])
                                        .is_ok_and(|r| r.header(CACHE_STATUS_HEADER) == Some("HIT"))
                                })
                                .count()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().unwrap())
                    .sum::<usize>()
            })
        }
    })
    .await
    .unwrap();
    say(&format!(
        "node purge: {warmed} of {} objects cached through {edge}",
        all.len()
    ));
    assert!(
        warmed >= all.len() * 99 / 100,
        "{warmed} of {} cached",
        all.len()
    );

    // The load: threads asking for the objects no purge names, hits counted, until told.
    let stop = Arc::new(AtomicBool::new(false));
    let (asked, hits) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load: Vec<_> = (0..4)
        .map(|t| {
            let (stop, asked, hits) = (stop.clone(), asked.clone(), hits.clone());
            std::thread::spawn(move || {
                let mut c = KeepAlive::new(edge, "cdn.node-e2e.test");
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let path = if i % 2 == 0 {
                        pv(PURGED + (i / 2) % KEPT)
                    } else {
                        other((i / 2) % OTHER)
                    };
                    let r = c.get(&path, &[]);
                    asked.fetch_add(1, Ordering::Relaxed);
                    if r.is_ok_and(|r| r.header(CACHE_STATUS_HEADER) == Some("HIT")) {
                        hits.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 4;
                }
            })
        })
        .collect();

    // The burst: 1,000 CdnPurges written at once (16 requests in flight), each path's write time
    // kept; pollers ask each purged object, as a newer version, until it is the new one.
    let purges: Api<CdnPurge> = Api::namespaced(client.clone(), &ns);
    let written: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; PURGED]));
    let seen: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; PURGED]));
    // They poll until every purge is Complete, then once more: an object not new by then was
    // served stale after its purge reported done.
    let complete_seen = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = (0..8)
        .map(|t| {
            let (written, seen, complete_seen) =
                (written.clone(), seen.clone(), complete_seen.clone());
            std::thread::spawn(move || {
                let mut c = KeepAlive::new(edge, "cdn.node-e2e.test");
                let mine: Vec<usize> = (t..PURGED).step_by(8).collect();
                loop {
                    let last_round = complete_seen.load(Ordering::SeqCst);
                    let (mut left, mut asked) = (0, 0);
                    for &i in &mine {
                        if seen.lock().unwrap()[i].is_some() {
                            continue;
                        }
                        left += 1;
                        if written.lock().unwrap()[i].is_none() {
                            continue;
                        }
                        asked += 1;
                        let new = c
                            .get(&pv(i), &[("X-Version", "2")])
                            .is_ok_and(|r| r.body.starts_with("v2"));
                        if new {
                            seen.lock().unwrap()[i] = Some(Instant::now());
                        }
                    }
                    if left == 0 || last_round {
                        break;
                    }
                    // Nothing written to ask for yet: a short wait, not a spin that would take
                    // the 2 cores from the pods measured.
                    if asked == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            })
        })
        .collect();
    let burst = Instant::now();
    futures::stream::iter(0..PURGED)
        .for_each_concurrent(16, |i| {
            let (purges, written) = (purges.clone(), written.clone());
            async move {
                let mut purge = CdnPurge::new(
                    &format!("burst-{i:04}"),
                    cdn_operator::api::CdnPurgeSpec::paths("edge", &[&pv(i)]),
                );
                purge.metadata.namespace = None;
                purges
                    .create(&PostParams::default(), &purge)
                    .await
                    .unwrap_or_else(|e| panic!("CdnPurge burst-{i:04}: {e}"));
                written.lock().unwrap()[i] = Some(Instant::now());
            }
        })
        .await;
    let writes_took = burst.elapsed();
    let complete = |prefix: &'static str, count: usize| {
        let purges = purges.clone();
        async move {
            let list = purges
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let done: Vec<&CdnPurge> = list
                .items
                .iter()
                .filter(|p| p.metadata.name.as_deref().unwrap_or("").starts_with(prefix))
                .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(PurgePhase::Complete))
                .collect();
            (done.len() == count)
                .then_some(())
                .ok_or(format!("{} of {count} Complete", done.len()))
        }
    };
    until(
        "the 1,000 purges Complete",
        Duration::from_secs(600),
        || complete("burst-", PURGED),
    )
    .await;
    let all_complete = burst.elapsed();
    complete_seen.store(true, Ordering::SeqCst);
    for poller in pollers {
        tokio::task::spawn_blocking(move || poller.join().unwrap())
            .await
            .unwrap();
    }
    let (written, seen) = (
        written.lock().unwrap().clone(),
        seen.lock().unwrap().clone(),
    );
    let mut latencies: Vec<f64> = written
        .iter()
        .zip(&seen)
        .filter_map(|(w, s)| Some(s.as_ref()?.duration_since(*w.as_ref()?).as_secs_f64()))
        .collect();
    let never = PURGED - latencies.len();
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    // Once Complete: no purged object served in its old version, by any pod.
    let stale = tokio::task::spawn_blocking(move || {
        let mut c = KeepAlive::new(edge, "cdn.node-e2e.test");
        (0..PURGED)
            .filter(|&i| !c.get(&pv(i), &[]).is_ok_and(|r| r.body.starts_with("v2")))
            .count()
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    for thread in load {
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
    }
    let (asked, hits) = (asked.load(Ordering::Relaxed), hits.load(Ordering::Relaxed));
    say(&format!(
        "node purge: 1,000 purges written in {writes_took:.2?}, all Complete {all_complete:.2?} after the first; \
         write -> new version served through the balancer: p50 {:.3} s, p99 {:.3} s, max {:.3} s ({never} never seen); \
         stale after Complete: {stale} of {PURGED}; load on objects not purged: {hits} hits of {asked} ({:.2} %)",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN),
        100.0 * hits as f64 / asked.max(1) as f64,
    ));
    assert_eq!(never, 0, "every purged object served new");
    assert_eq!(stale, 0, "no stale body once Complete");
    assert!(hits * 100 >= asked * 99, "{hits} hits of {asked}");
    let burst_purge: CdnPurge = purges.get("burst-0000").await.unwrap();
    let status = burst_purge.status.unwrap();
    assert_eq!(status.clusters, ["shield", "cache-1", "cache-2"]);
    assert_eq!(status.progress.as_deref(), Some("5/5"));

    // One purge of 10,000 objects by their surrogate key.
    let mut by_key = CdnPurge::new("bulk", cdn_operator::api::CdnPurgeSpec::paths("edge", &[]));
    by_key.spec.paths = None;
    by_key.spec.surrogate_keys = Some(vec!["bulk".into()]);
    let started = Instant::now();
    purges
        .create(&PostParams::default(), &by_key)
        .await
        .unwrap();
    until(
        "the purge by key Complete",
        Duration::from_secs(300),
        || complete("bulk", 1),
    )
    .await;
    let took = started.elapsed();
    let done = purges.get("bulk").await.unwrap().status.unwrap();
    let (misses, kept) = tokio::task::spawn_blocking(move || {
        let mut c = KeepAlive::new(edge, "cdn.node-e2e.test");
        let status = |c: &mut KeepAlive, p: String| {
            c.get(&p, &[])
                .ok()
                .and_then(|r| r.header(CACHE_STATUS_HEADER).map(str::to_string))
        };
        let misses = (0..BULK)
            .step_by(BULK / 500)
            .filter(|&i| status(&mut c, bulk(i)).as_deref() == Some("MISS"))
            .count();
        let kept = (0..OTHER)
            .filter(|&i| status(&mut c, other(i)).as_deref() == Some("HIT"))
            .count();
        (misses, kept)
    })
    .await
    .unwrap();
    say(&format!(
        "node purge: by surrogate key, 10,000 objects: write -> Complete {took:.2?} ({} objects invalidated on {} pods); \
         then {misses} of 500 of them MISS, {kept} of {OTHER} of another key HIT",
        done.objects.unwrap_or(0),
        done.progress.as_deref().unwrap_or("?"),
    ));
    assert_eq!(
        done.objects,
        Some(BULK as i64 * 2),
        "each object on a cache of the pool and on the shield"
    );
    assert_eq!(misses, 500);
    assert!(kept * 100 >= OTHER * 99, "{kept} of {OTHER}");
}
