//! cdn-operator end to end, against the cluster of `KUBECONFIG`: the built binary runs out of
//! cluster, one namespace per test. With no reachable API server each test prints one line and
//! passes. Run: `cargo build && cargo test -p cdn-operator-e2e -- --test-threads=4`.

use cdn_operator::api::{At, CdnCluster, CdnPurge, Phase, PurgePhase, State};
use cdn_operator_e2e::{eventually, fixture, Env, OperatorOptions};
use cdn_operator_testkit::racing;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

const FINALIZER: &str = "cnat.programming-kubernetes.info/run-once";

async fn state(env: &Env, name: &str) -> Option<State> {
    let cluster = env.api::<CdnCluster>().get_opt(name).await.ok()??;
    cluster.status?.state
}

/// Waits until `name` is in one of `states` with its status describing the current generation.
async fn wait_state(env: &Env, name: &str, states: &[State]) -> State {
    eventually(
        &format!("CdnCluster {name} in {states:?}"),
        WAIT,
        || async {
            let cluster = env.api::<CdnCluster>().get_opt(name).await.ok()??;
            let status = cluster.status?;
            let current = status.observed_generation == cluster.metadata.generation;
            status.state.filter(|s| current && states.contains(s))
        },
    )
    .await
}

const DEPLOYED: &[State] = &[State::Deploying, State::Running];

/// Waits for an Event of the operator about `name` with this reason and note.
async fn wait_event(env: &Env, name: &str, reason: &str, note: &str) {
    eventually(
        &format!("Event {reason} `{note}` about {name}"),
        WAIT,
        || async {
            env.events()
                .await
                .iter()
                .any(|(n, _, r, m)| n == name && r == reason && m == note)
                .then_some(())
        },
    )
    .await
}

async fn get<K>(env: &Env, name: &str) -> Option<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    env.api::<K>().get_opt(name).await.expect("GET")
}

/// The three children of `name` exist, owned by the CdnCluster as its controller.
async fn assert_children(env: &Env, name: &str) {
    let cluster: CdnCluster = get(env, name).await.expect("the CdnCluster");
    let uid = cluster.uid();
    let owned = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
        refs.iter()
            .any(|r| Some(&r.uid) == uid.as_ref() && r.controller == Some(true))
    };
    let (d_name, cm_name) = (format!("{name}-deployment"), format!("{name}-nginx"));
    let deployment: Deployment = eventually(&d_name, WAIT, || get(env, &d_name)).await;
    assert!(
        owned(deployment.owner_references()),
        "{name}-deployment is owned by {name}"
    );
    let config_map: ConfigMap = eventually(&cm_name, WAIT, || get(env, &cm_name)).await;
    assert!(owned(config_map.owner_references()));
    assert!(config_map
        .data
        .as_ref()
        .is_some_and(|d| d.contains_key("nginx.conf")));
    let service: Service = eventually(&format!("Service {name}"), WAIT, || get(env, name)).await;
    assert!(owned(service.owner_references()));
}

fn seed(name: &str) -> String {
    fixture(&format!("seed-examples/{name}.yaml"))
}

#[tokio::test]
async fn seed_examples_in_order_give_the_seed_event_sequence() {
    let Some(mut env) = Env::new("seed-examples").await else {
        return;
    };
    env.start_operator().await;

    env.apply_yaml(&seed("cdncluster-balancer"))
        .await
        .expect("balancer");
    assert_eq!(
        wait_state(&env, "balancer", &[State::WaitingSource]).await,
        State::WaitingSource
    );
    wait_event(
        &env,
        "balancer",
        "SourceNotFound",
        "Source cache-live not found, will retry later",
    )
    .await;
    assert!(
        get::<Deployment>(&env, "balancer-deployment")
            .await
            .is_none(),
        "nothing deployed while a source is missing"
    );

    env.apply_yaml(&seed("cdncluster-cache-live"))
        .await
        .expect("cache-live");
    wait_state(&env, "cache-live", DEPLOYED).await;
    wait_event(
        &env,
        "cache-live",
        "DeploymentCreated",
        "The Deployment cache-live-deployment has been created",
    )
    .await;
    wait_event(
        &env,
        "balancer",
        "SourceNotFound",
        "Source cache-vod not found, will retry later",
    )
    .await;
    assert_eq!(state(&env, "balancer").await, Some(State::WaitingSource));

    env.apply_yaml(&seed("cdncluster-cache-vod"))
        .await
        .expect("cache-vod");
    wait_state(&env, "cache-vod", DEPLOYED).await;
    wait_state(&env, "balancer", DEPLOYED).await;
    wait_event(
        &env,
        "balancer",
        "DeploymentCreated",
        "The Deployment balancer-deployment has been created",
    )
    .await;

    for name in ["balancer", "cache-live", "cache-vod"] {
        assert_children(&env, name).await;
    }
    let seen: Vec<(String, String, String)> = env
        .events()
        .await
        .into_iter()
        .filter(|(_, _, reason, _)| reason == "SourceNotFound" || reason == "DeploymentCreated")
        .map(|(name, _, reason, note)| (name, reason, note))
        .collect();
    let e = |name: &str, reason: &str, note: &str| {
        (name.to_string(), reason.to_string(), note.to_string())
    };
    let first = e(
        "balancer",
        "SourceNotFound",
        "Source cache-live not found, will retry later",
    );
    let live = e(
        "cache-live",
        "DeploymentCreated",
        "The Deployment cache-live-deployment has been created",
    );
    let wait_vod = e(
        "balancer",
        "SourceNotFound",
        "Source cache-vod not found, will retry later",
    );
    let vod = e(
        "cache-vod",
        "DeploymentCreated",
        "The Deployment cache-vod-deployment has been created",
    );
    let last = e(
        "balancer",
        "DeploymentCreated",
        "The Deployment balancer-deployment has been created",
    );
    // A source's creation triggers its own reconcile and its parent's at once: cache-live's
    // `DeploymentCreated` and the balancer's next `SourceNotFound` may come in either order, and
    // so may cache-vod's `DeploymentCreated` and the balancer's (the balancer deploys once its
    // sources exist, as the seed says, not once they are deployed). Every other step waited for
    // the previous one.
    let orders = [
        [&first, &live, &wait_vod, &vod, &last],
        [&first, &wait_vod, &live, &vod, &last],
        [&first, &live, &wait_vod, &last, &vod],
        [&first, &wait_vod, &live, &last, &vod],
    ];
    assert!(
        orders
            .iter()
            .any(|order| order.iter().copied().cloned().eq(seen.iter().cloned())),
        "Event sequence: {seen:#?}"
    );
    let warnings: Vec<_> = env
        .events()
        .await
        .into_iter()
        .filter(|(_, t, _, _)| t == "Warning")
        .collect();
    assert!(warnings.is_empty(), "no Warning Events: {warnings:?}");
}

#[tokio::test]
async fn a_deleted_deployment_is_recreated() {
    let Some(mut env) = Env::new("deleted-deployment").await else {
        return;
    };
    env.start_operator().await;
    env.create_cluster("foo", json!({"role": "cache", "sources": []}))
        .await
        .expect("foo");
    wait_state(&env, "foo", DEPLOYED).await;
    let first: Deployment =
        eventually("foo-deployment", WAIT, || get(&env, "foo-deployment")).await;
    env.api::<Deployment>()
        .delete("foo-deployment", &DeleteParams::foreground())
        .await
        .expect("delete foo-deployment");
    let again: Deployment = eventually("foo-deployment recreated", WAIT, || async {
        get::<Deployment>(&env, "foo-deployment")
            .await
            .filter(|d| d.uid() != first.uid())
    })
    .await;
    assert_ne!(again.uid(), first.uid());
    assert_children(&env, "foo").await;
    eventually("DeploymentCreated reported twice", WAIT, || async {
        (env.event_count("foo", "DeploymentCreated").await >= 2).then_some(())
    })
    .await;

    // A deleted ConfigMap and Service are re-created too, each with one Warning.
    for (kind, name) in [("ConfigMap", "foo-nginx"), ("Service", "foo")] {
        let dp = DeleteParams::default();
        match kind {
            "ConfigMap" => env.api::<ConfigMap>().delete(name, &dp).await.map(|_| ()),
            _ => env.api::<Service>().delete(name, &dp).await.map(|_| ()),
        }
        .expect("delete by hand");
        let note = format!("{kind} {name} was deleted outside the operator; re-created it");
        wait_event(&env, "foo", "ChildRestored", &note).await;
    }
    assert_children(&env, "foo").await;

    // One fact, one Event: the re-created Deployment is announced once, and nothing else is
    // said of it, even as its status changes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(env.event_count("foo", "DeploymentCreated").await, 2);
    let restored: Vec<String> = env
        .events()
        .await
        .into_iter()
        .filter(|(n, _, r, _)| n == "foo" && r == "ChildRestored")
        .map(|(_, _, _, note)| note)
        .collect();
    assert_eq!(
        restored,
        [
            "ConfigMap foo-nginx was deleted outside the operator; re-created it",
            "Service foo was deleted outside the operator; re-created it"
        ]
    );

    // An ordinary deletion is quiet: no failed reconcile, no warning about the object gone.
    env.api::<CdnCluster>()
        .delete("foo", &DeleteParams::default())
        .await
        .expect("delete foo");
    eventually("foo gone", WAIT, || async {
        get::<CdnCluster>(&env, "foo").await.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let logs = env.logs();
    for noise in ["; retried in", "not found in local store", "WARN"] {
        assert!(!logs.contains(noise), "`{noise}` in the logs:\n{logs}");
    }
}

/// The kstatus condition `type_` of `name`: (status, reason, message).
async fn condition(env: &Env, name: &str, type_: &str) -> Option<(String, String, String)> {
    let cluster: CdnCluster = get(env, name).await?;
    let c = cluster
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.into(), c.reason.into(), c.message.into()))
}

#[tokio::test]
async fn a_child_the_server_refuses_is_reported_and_deployed_once_allowed() {
    let Some(mut env) = Env::new("refused-child").await else {
        return;
    };
    // A quota of no Services: the API server refuses the Service with 403.
    env.apply_yaml(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: no-services\nspec:\n  hard:\n    count/services: \"0\"\n",
    )
    .await
    .expect("the quota");
    env.start_operator().await;
    env.create_cluster("foo", json!({"role": "cache", "sources": []}))
        .await
        .expect("foo");
    wait_state(&env, "foo", &[State::Error]).await;
    let (status, reason, message) = condition(&env, "foo", "Ready").await.unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "ApplyFailed"));
    assert!(
        message.starts_with("Service foo was refused (403): services \"foo\" is forbidden: exceeded quota: no-services"),
        "{message}"
    );
    assert_eq!(condition(&env, "foo", "Stalled").await.unwrap().0, "True");
    wait_event(&env, "foo", "ApplyFailed", &message).await;

    // Retried with backoff (1, 2, 4 s...), reported once.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(env.event_count("foo", "ApplyFailed").await, 1);
    assert!(
        get::<Deployment>(&env, "foo-deployment").await.is_none(),
        "no Deployment without its Service"
    );
    // Each failure is one line: the object, the server's words, when it is tried again.
    let logs = env.logs();
    assert!(
        logs.lines().any(|line| line.contains("CdnCluster ")
            && line.contains("/foo: could not apply Service foo: services")
            && line.contains("exceeded quota: no-services")
            && line.contains("; retried in ")),
        "{logs}"
    );

    // The quota lifted: the next retry deploys.
    env.api::<k8s_openapi::api::core::v1::ResourceQuota>()
        .delete("no-services", &DeleteParams::default())
        .await
        .expect("delete the quota");
    wait_state(&env, "foo", DEPLOYED).await;
    assert_children(&env, "foo").await;
    assert_eq!(condition(&env, "foo", "Stalled").await.unwrap().0, "False");
}

/// The status of the pod captured on a v1.36.2 node as `file` (`tests/fixtures/real-node/`): its
/// phase and its nginx container's status, as the kubelet writes them.
fn kubelet_status(file: &str) -> serde_json::Value {
    let path = format!(
        "{}/../tests/fixtures/real-node/{file}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let pod: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture")).unwrap();
    let status = &pod["status"];
    json!({"phase": status["phase"], "containerStatuses": status["containerStatuses"]})
}

/// Without a kubelet, the test writes the pod's status as a node's kubelet wrote it (a crash
/// loop with nginx's last lines): the CdnCluster's Ready says why, with one Warning; the
/// kubelet's next attempts write nothing; a pod that recovers clears it. On a cluster with a node
/// the node tests cover it (its kubelet would overwrite the status written here).
#[tokio::test]
async fn a_crash_looping_pod_is_the_clusters_reason_once() {
    let Some(mut env) = Env::new("pod-reason").await else {
        return;
    };
    if kubelet_runs(&env).await {
        eprintln!("a kubelet runs: e2e/tests/node.rs covers pods that cannot run");
        return;
    }
    env.start_operator().await;
    env.create_cluster("crash", json!({"role": "cache", "sources": []}))
        .await
        .expect("crash");
    wait_state(&env, "crash", DEPLOYED).await;
    let pods: Api<Pod> = env.api();
    let selector = ListParams::default().labels("deployment=crash-deployment");
    let pod = eventually("the pod of crash-deployment", WAIT, || async {
        let pods = pods.list(&selector).await.ok()?.items;
        pods.first().map(ResourceExt::name_any)
    })
    .await;
    let kubelet = |status: serde_json::Value| {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move {
            pods.patch_status(
                &pod,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("the pod's status")
        }
    };
    kubelet(kubelet_status("pod-crash-logs")).await;
    let expected =
        "container nginx exits with code 127: /etc/nginx/cdn/run.sh: line 28: cksum: not found";
    eventually("Ready says CrashLoopBackOff", WAIT, || async {
        let (_, reason, message) = condition(&env, "crash", "Ready").await?;
        (reason == "CrashLoopBackOff" && message == expected).then_some(())
    })
    .await;
    wait_event(&env, "crash", "CrashLoopBackOff", expected).await;
    assert_eq!(
        condition(&env, "crash", "Stalled").await.unwrap().0,
        "False"
    );

    // The kubelet's next attempt: another restart count and back-off, the same problem.
    let version = get::<CdnCluster>(&env, "crash")
        .await
        .unwrap()
        .resource_version();
    let mut again = kubelet_status("pod-crash-logs");
    again["containerStatuses"][0]["restartCount"] = json!(9);
    again["containerStatuses"][0]["state"]["waiting"]["message"] =
        json!("back-off 5m0s restarting failed container=nginx");
    kubelet(again).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        get::<CdnCluster>(&env, "crash")
            .await
            .unwrap()
            .resource_version(),
        version,
        "no status write for a retry"
    );
    assert_eq!(env.event_count("crash", "CrashLoopBackOff").await, 1);

    // The pod runs and is ready: the reason goes.
    let mut ready = kubelet_status("pod-crash-logs");
    ready["containerStatuses"][0]["ready"] = json!(true);
    ready["containerStatuses"][0]["started"] = json!(true);
    ready["containerStatuses"][0]["state"] =
        json!({"running": {"startedAt": "2026-11-27T02:00:00Z"}});
    kubelet(ready).await;
    eventually("Ready no longer says CrashLoopBackOff", WAIT, || async {
        let (_, reason, _) = condition(&env, "crash", "Ready").await?;
        (reason != "CrashLoopBackOff").then_some(())
    })
    .await;
}

#[tokio::test]
async fn foo3_waits_for_asource_and_deploys_when_it_appears() {
    let Some(mut env) = Env::new("foo3-waits").await else {
        return;
    };
    env.start_operator().await;
    env.create_cluster(
        "foo3",
        json!({"role": "balancer", "sources": [{"name": "asource"}]}),
    )
    .await
    .expect("foo3");
    wait_state(&env, "foo3", &[State::WaitingSource]).await;
    wait_event(
        &env,
        "foo3",
        "SourceNotFound",
        "Source asource not found, will retry later",
    )
    .await;
    assert!(get::<Deployment>(&env, "foo3-deployment").await.is_none());

    // The parent is reconciled again when its source appears: no polling, a watch event.
    env.create_cluster("asource", json!({"role": "cache", "sources": []}))
        .await
        .expect("asource");
    wait_state(&env, "asource", DEPLOYED).await;
    wait_state(&env, "foo3", DEPLOYED).await;
    assert_children(&env, "foo3").await;
    let config_map: ConfigMap = get(&env, "foo3-nginx").await.expect("foo3-nginx");
    let conf = &config_map.data.expect("data")["nginx.conf"];
    assert!(
        conf.contains("asource"),
        "foo3's nginx.conf routes to asource:\n{conf}"
    );
}

#[tokio::test]
async fn a_pool_of_two_caches_deploys_one_hashed_upstream() {
    let Some(mut env) = Env::new("pool").await else {
        return;
    };
    env.start_operator().await;
    // Two sources without pathCondition: one pool (before pools, Invalid).
    env.create_cluster(
        "balancer",
        json!({"role": "balancer", "sources": [{"name": "cache-a", "weight": 2}, {"name": "cache-b"}]}),
    )
    .await
    .expect("balancer");
    for cache in ["cache-a", "cache-b"] {
        env.create_cluster(cache, json!({"role": "cache", "sources": []}))
            .await
            .expect(cache);
    }
    // Without a kubelet no replica gets ready: Deploying is as far as it goes.
    wait_state(&env, "balancer", DEPLOYED).await;
    assert_children(&env, "balancer").await;
    let config_map: ConfigMap = get(&env, "balancer-nginx").await.expect("balancer-nginx");
    let conf = &config_map.data.expect("data")["nginx.conf"];
    let ns = env.ns.clone();
    assert_eq!(conf.matches("upstream source_").count(), 1, "{conf}");
    for line in [
        "hash $host$uri$cdn_key_args consistent;".to_string(),
        format!("server cache-a.{ns}.svc.cluster.local service=http resolve weight=4 max_fails=2 fail_timeout=5s;"),
        format!("server cache-b.{ns}.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;"),
        "# default pool cache-a + cache-b".to_string(),
    ] {
        assert!(conf.contains(&line), "{line} missing in\n{conf}");
    }
    assert_eq!(
        condition(&env, "balancer", "Stalled").await.unwrap().0,
        "False"
    );
    // The caches' Services are headless (the cluster DNS names each pod, a member of the ring);
    // the balancer's has an address.
    let cluster_ips = |s: Service| s.spec.and_then(|s| s.cluster_ips).unwrap_or_default();
    for cache in ["cache-a", "cache-b"] {
        let service: Service = get(&env, cache).await.expect(cache);
        assert_eq!(cluster_ips(service), ["None"], "{cache}");
    }
    let service: Service = get(&env, "balancer").await.expect("balancer");
    let ips = cluster_ips(service);
    assert!(
        ips.len() == 1 && ips[0].parse::<std::net::IpAddr>().is_ok(),
        "{ips:?}"
    );
}

#[tokio::test]
async fn a_namespace_deleted_under_its_clusters_and_ats_is_quiet() {
    let Some(mut env) = Env::new("namespace-deleted").await else {
        return;
    };
    env.start_operator().await;
    for name in [
        "cdncluster-balancer",
        "cdncluster-cache-live",
        "cdncluster-cache-vod",
    ] {
        env.apply_yaml(&seed(name)).await.expect(name);
    }
    for name in ["balancer", "cache-live", "cache-vod"] {
        wait_state(&env, name, DEPLOYED).await;
    }
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    // An At waiting for its time, which goes with the namespace.
    env.apply_yaml(&format!(
        "apiVersion: cnat.programming-kubernetes.info/v1alpha1\nkind: At\nmetadata: {{name: later}}\n\
         spec: {{schedule: \"{}\", command: \"echo later\"}}\n",
        later.strftime("%Y-%m-%dT%H:%M:%SZ")
    ))
    .await
    .expect("the At");
    eventually("the At pending", WAIT, || async {
        (at_phase(&env, "later").await == Some(Phase::Pending)).then_some(())
    })
    .await;
    // Another controller's finalizer holds cache-live a while (as a slow pod holds a
    // namespace): its children are deleted with the namespace before it, and the operator,
    // putting them back, is refused: the namespace is being terminated.
    let hold = json!({"metadata": {"finalizers": ["e2e.cdn-operator.anevia.com/hold"]}});
    env.api::<CdnCluster>()
        .patch("cache-live", &PatchParams::default(), &Patch::Merge(hold))
        .await
        .expect("cache-live held");
    cdn_operator_e2e::delete_namespace(&env.client, &env.ns)
        .await
        .expect("the namespace deleted");
    eventually("the others gone", WAIT, || async {
        let clusters = env
            .api::<CdnCluster>()
            .list(&ListParams::default())
            .await
            .ok()?;
        let ats = env.api::<At>().list(&ListParams::default()).await.ok()?;
        (clusters.items.len() == 1 && ats.items.is_empty()).then_some(())
    })
    .await;
    // Long enough for retries: backoff 1 s, 2 s, 4 s.
    tokio::time::sleep(Duration::from_secs(8)).await;
    env.api::<CdnCluster>()
        .patch(
            "cache-live",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("cache-live released");
    let logs = env.logs();
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    assert!(
        warnings.is_empty(),
        "the deletion of a namespace is no warning:\n{}",
        warnings.join("\n")
    );
}

#[tokio::test]
async fn a_cache_service_made_with_an_address_is_created_again_headless() {
    let Some(mut env) = Env::new("headless-upgrade").await else {
        return;
    };
    // The previous release's world: the cache and its Service with an address, applied by the
    // operator's field manager.
    env.create_cluster("old", json!({"role": "cache", "sources": []}))
        .await
        .expect("old");
    let cluster: CdnCluster = get(&env, "old").await.expect("old");
    let owner = cluster
        .controller_owner_ref(&())
        .expect("an owner reference");
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": "old", "ownerReferences": [owner],
            "labels": cdn_operator::cdncluster::build::labels(&cluster),
        },
        "spec": {
            "selector": {"deployment": "old-deployment"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }))
    .unwrap();
    let params = PatchParams::apply(cdn_operator::kubernetes::record::FIELD_MANAGER).force();
    let before = env
        .api::<Service>()
        .patch("old", &params, &Patch::Apply(&service))
        .await
        .expect("the old Service");
    assert_ne!(
        before.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("None")
    );

    env.start_operator().await;
    let after: Service = eventually("Service old headless", WAIT, || async {
        get::<Service>(&env, "old")
            .await
            .filter(|s| s.spec.as_ref().unwrap().cluster_ip.as_deref() == Some("None"))
    })
    .await;
    assert_ne!(after.uid(), before.uid(), "created again");
    wait_state(&env, "old", DEPLOYED).await;
    assert_children(&env, "old").await;
    let logs = env.logs();
    assert!(
        !logs.contains("; retried in"),
        "no reconcile failed: {logs}"
    );
}

/// The API server's refusal of `spec`, with the CRDs installed (no operator needed).
async fn refused(env: &Env, name: &str, spec: serde_json::Value) -> String {
    match env.create_cluster(name, spec).await {
        Ok(_) => panic!("the API server accepted {name}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{name}: {status:?}");
            status.message
        }
        Err(other) => panic!("{name}: {other}"),
    }
}

#[tokio::test]
async fn bad_input_is_refused_by_the_api_server_with_a_clear_message() {
    let Some(env) = Env::new("bad-input").await else {
        return;
    };
    let message = refused(
        &env,
        "unknown-role",
        json!({"role": "origin", "sources": []}),
    )
    .await;
    assert!(
        message.contains("spec.role")
            && message.contains("\"balancer\"")
            && message.contains("\"cache\""),
        "unknown role: {message}"
    );

    // apiextensions prunes a null in a non-nullable field, then `required` refuses it; older
    // servers said "must be of type array". Either names the field.
    let message = refused(
        &env,
        "null-sources",
        json!({"role": "cache", "sources": null}),
    )
    .await;
    assert!(
        message.contains("spec.sources")
            && (message.contains("Required value") || message.contains("must be of type array")),
        "null sources: {message}"
    );

    let message = refused(
        &env,
        "malformed-source",
        json!({"role": "cache", "sources": ["cache-live"]}),
    )
    .await;
    assert!(
        message.contains("spec.sources[0]") && message.contains("must be of type object"),
        "malformed source: {message}"
    );

    let message = refused(
        &env,
        "nameless-source",
        json!({"role": "cache", "sources": [{"pathCondition": "^/a/"}]}),
    )
    .await;
    assert!(
        message.contains("spec.sources[0].name") && message.contains("Required value"),
        "source without a name: {message}"
    );

    // CEL: a cache's Service is headless, so only a balancer can be a load balancer.
    let message = refused(
        &env,
        "exposed-cache",
        json!({"role": "cache", "sources": [], "service": {"type": "LoadBalancer"}}),
    )
    .await;
    assert!(
        message.contains("only a balancer's Service can be a NodePort or LoadBalancer"),
        "exposed cache: {message}"
    );
    let message = refused(
        &env,
        "local-cluster-ip",
        json!({"role": "balancer", "sources": [], "service": {"externalTrafficPolicy": "Local"}}),
    )
    .await;
    assert!(
        message.contains("externalTrafficPolicy applies to a NodePort or LoadBalancer Service"),
        "traffic policy without a node port: {message}"
    );
    let message = refused(
        &env,
        "zero-unavailable",
        json!({"role": "cache", "sources": [], "pods": {"maxUnavailable": 0}}),
    )
    .await;
    assert!(
        message.contains("spec.pods.maxUnavailable")
            && message.contains("must be at least 1, or a percentage from 1% to 100%"),
        "maxUnavailable 0 would block every drain: {message}"
    );

    // CEL on metadata.name: 53 characters would make a pod label of 64.
    let long = format!("a{}", "b".repeat(52));
    let message = refused(&env, &long, json!({"role": "cache", "sources": []})).await;
    assert!(
        message.contains("metadata.name must be at most 52 characters"),
        "long name: {message}"
    );
}

/// `kubectl scale` (the scale subresource) sets a CdnCluster's replicas, which reach its
/// Deployment; with more than one replica a PodDisruptionBudget keeps a drain from emptying it,
/// and it goes when the cluster is back to one. The status gives the selector an autoscaler reads
/// the pods by.
#[tokio::test]
async fn a_cluster_scales_through_its_scale_subresource_with_a_disruption_budget() {
    use k8s_openapi::api::autoscaling::v1::Scale;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let Some(mut env) = Env::new("scale").await else {
        return;
    };
    env.start_operator().await;
    env.create_cluster("foo", json!({"role": "cache", "sources": []}))
        .await
        .expect("foo");
    wait_state(&env, "foo", DEPLOYED).await;
    let clusters = env.api::<CdnCluster>();
    let scale: Scale = eventually("the scale of foo with its selector", WAIT, || async {
        clusters.get_scale("foo").await.ok().filter(|s| {
            s.status
                .as_ref()
                .and_then(|s| s.selector.as_deref())
                .is_some()
        })
    })
    .await;
    let status = scale.status.unwrap();
    assert_eq!(
        (status.replicas, status.selector.as_deref()),
        (1, Some("deployment=foo-deployment"))
    );

    let patch = json!({"spec": {"replicas": 3}});
    clusters
        .patch_scale("foo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("kubectl scale --replicas=3");
    eventually("foo-deployment at 3 replicas", WAIT, || async {
        get::<Deployment>(&env, "foo-deployment")
            .await
            .filter(|d| d.spec.as_ref().unwrap().replicas == Some(3))
    })
    .await;
    let budget: PodDisruptionBudget =
        eventually("foo's PodDisruptionBudget", WAIT, || get(&env, "foo")).await;
    assert_eq!(budget.owner_references()[0].name, "foo");
    let spec = budget.spec.unwrap();
    assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(
        spec.selector.unwrap().match_labels.unwrap()["deployment"],
        "foo-deployment"
    );
    eventually("the scale's status at 3", WAIT, || async {
        let scale = clusters.get_scale("foo").await.ok()?;
        (scale.status?.replicas == 3).then_some(())
    })
    .await;

    let patch = json!({"spec": {"replicas": 1}});
    clusters
        .patch_scale("foo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("kubectl scale --replicas=1");
    eventually("foo's PodDisruptionBudget deleted", WAIT, || async {
        get::<PodDisruptionBudget>(&env, "foo")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let logs = env.logs();
    assert!(!logs.contains("; retried in"), "{logs}");
}

/// A cache given `cache.volume`: the server takes its StatefulSet (a claim per pod, the pods named
/// under the headless Service) and refuses a change of its claims with the CRD's message; the
/// volume removed, a Deployment serves again and the StatefulSet goes once its pods are ready.
#[tokio::test]
async fn a_cache_with_a_volume_runs_in_a_stateful_set_its_claims_made_once() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let Some(mut env) = Env::new("cache-volume").await else {
        return;
    };
    env.start_operator().await;
    let spec = json!({"role": "cache", "replicas": 2, "sources": [],
                      "cache": {"size": "2g", "volume": {"storageClassName": "fast"}}});
    env.create_cluster("vod", spec).await.expect("vod");
    let set: StatefulSet = eventually("StatefulSet vod", WAIT, || get(&env, "vod")).await;
    let spec = set.spec.unwrap();
    assert_eq!(spec.service_name.as_deref(), Some("vod"));
    assert_eq!(spec.replicas, Some(2));
    let claim = spec.volume_claim_templates.unwrap()[0]
        .spec
        .clone()
        .unwrap();
    assert_eq!(claim.storage_class_name.as_deref(), Some("fast"));
    let storage = &claim.resources.unwrap().requests.unwrap()["storage"];
    assert_eq!(storage.0, "2560Mi");
    assert!(get::<Deployment>(&env, "vod-deployment").await.is_none());
    wait_state(&env, "vod", DEPLOYED).await;

    // Its claims are made once: the server says so, and nothing changes.
    let clusters = env.api::<CdnCluster>();
    let bigger = json!({"spec": {"cache": {"size": "4g"}}});
    match clusters
        .patch("vod", &PatchParams::default(), &Patch::Merge(&bigger))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status
                    .message
                    .contains("a cache with a volume keeps its size and storage class"),
                "{}",
                status.message
            );
        }
        other => panic!("a new size was taken: {other:?}"),
    }

    // The volume removed: a Deployment, which serves before the StatefulSet goes.
    let plain = json!({"spec": {"cache": {"volume": null}}});
    clusters
        .patch("vod", &PatchParams::default(), &Patch::Merge(&plain))
        .await
        .expect("the volume removed");
    let deployment: Deployment = eventually("Deployment vod-deployment", WAIT, || {
        get(&env, "vod-deployment")
    })
    .await;
    assert!(
        get::<StatefulSet>(&env, "vod").await.is_some(),
        "until replaced"
    );
    // Its pods ready, as the Deployment controller says once a kubelet runs them (this server's
    // controller, with no kubelet, writes its status back: said again until the operator acts).
    let generation = deployment.metadata.generation;
    let status = json!({"status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                                   "observedGeneration": generation}});
    let deployments = env.api::<Deployment>();
    eventually("StatefulSet vod deleted", WAIT, || async {
        deployments
            .patch_status(
                "vod-deployment",
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .expect("the Deployment's status");
        tokio::time::sleep(Duration::from_millis(200)).await;
        get::<StatefulSet>(&env, "vod")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert!(get::<Deployment>(&env, "vod-deployment").await.is_some());
    let logs = env.logs();
    assert!(!logs.contains("; retried in"), "{logs}");
}

/// A balancer exposed as a NodePort with `externalTrafficPolicy: Local` and a load balancer's
/// annotations: the Service says so (the server allocates the node port); back to the default,
/// it is a ClusterIP Service again, and annotations another manager added stay.
#[tokio::test]
async fn a_balancer_is_exposed_as_its_spec_says() {
    let Some(mut env) = Env::new("exposed").await else {
        return;
    };
    env.start_operator().await;
    env.create_cluster(
        "edge",
        json!({"role": "balancer", "sources": [], "service": {
            "type": "NodePort",
            "externalTrafficPolicy": "Local",
            "annotations": {"metallb.universe.tf/address-pool": "viewers"},
        }}),
    )
    .await
    .expect("edge");
    wait_state(&env, "edge", DEPLOYED).await;
    let service: Service = eventually("edge's NodePort Service", WAIT, || async {
        get::<Service>(&env, "edge")
            .await
            .filter(|s| s.spec.as_ref().unwrap().type_.as_deref() == Some("NodePort"))
    })
    .await;
    let spec = service.spec.as_ref().unwrap();
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
    assert!(spec.ports.as_ref().unwrap()[0].node_port.is_some());
    assert_eq!(
        service.annotations()["metallb.universe.tf/address-pool"],
        "viewers"
    );
    // Another manager's annotation.
    let patch = json!({"metadata": {"annotations": {"example.com/owner": "platform"}}});
    env.api::<Service>()
        .patch("edge", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");

    let patch = json!({"spec": {"service": null}});
    env.api::<CdnCluster>()
        .patch("edge", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("unexpose");
    let service: Service = eventually("edge's ClusterIP Service", WAIT, || async {
        get::<Service>(&env, "edge")
            .await
            .filter(|s| s.spec.as_ref().unwrap().type_.as_deref() == Some("ClusterIP"))
    })
    .await;
    assert!(!service
        .annotations()
        .contains_key("metallb.universe.tf/address-pool"));
    assert_eq!(service.annotations()["example.com/owner"], "platform");
}

#[tokio::test]
async fn a_cycle_is_invalid_with_a_warning_event() {
    let Some(mut env) = Env::new("cycle").await else {
        return;
    };
    env.start_operator().await;
    env.create_cluster("a", json!({"role": "cache", "sources": [{"name": "b"}]}))
        .await
        .expect("a");
    wait_state(&env, "a", &[State::WaitingSource]).await;
    env.create_cluster("b", json!({"role": "cache", "sources": [{"name": "a"}]}))
        .await
        .expect("b");
    for name in ["a", "b"] {
        wait_state(&env, name, &[State::Invalid]).await;
        let event = eventually(&format!("InvalidSpec Event about {name}"), WAIT, || async {
            env.events()
                .await
                .into_iter()
                .find(|(n, _, r, _)| n == name && r == "InvalidSpec")
        })
        .await;
        assert_eq!(event.1, "Warning");
        assert!(
            event.3.contains("cycle") || event.3.contains("a → b") || event.3.contains("b → a"),
            "the message explains the cycle: {}",
            event.3
        );
        assert!(get::<Deployment>(&env, &format!("{name}-deployment"))
            .await
            .is_none());
    }
}

/// Whether some node reports Ready: then a kubelet runs the At's pod; otherwise the test plays
/// the kubelet and writes the pod's end itself.
async fn kubelet_runs(env: &Env) -> bool {
    let nodes = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    nodes.iter().any(|n| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
}

/// Brings the At's pod to Succeeded: waits for the kubelet where one runs (and checks the
/// command's output), else writes the status as a kubelet would.
async fn pod_succeeds(env: &Env, pod: &str, expected_output: Option<&str>) {
    let pods = env.api::<Pod>();
    if kubelet_runs(env).await {
        eventually(
            &format!("pod {pod} Succeeded"),
            Duration::from_secs(180),
            || async {
                let p = pods.get(pod).await.ok()?;
                (p.status?.phase.as_deref() == Some("Succeeded")).then_some(())
            },
        )
        .await;
        if let Some(output) = expected_output {
            let logs = pods.logs(pod, &Default::default()).await.expect("pod logs");
            assert!(logs.contains(output), "pod {pod} printed {logs:?}");
        }
    } else {
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let image = pods
            .get(pod)
            .await
            .expect("pod")
            .spec
            .expect("spec")
            .containers[0]
            .image
            .clone();
        let status = json!({"status": {
            "phase": "Succeeded",
            "containerStatuses": [{
                "name": "busybox", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}},
            }],
        }});
        pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("setting the pod's status to Succeeded (no kubelet here)");
    }
}

async fn at_phase(env: &Env, name: &str) -> Option<Phase> {
    env.api::<At>().get_opt(name).await.ok()??.status?.phase
}

async fn wait_phase(env: &Env, name: &str, phase: Phase, timeout: Duration) {
    eventually(
        &format!("At {name} {}", phase.as_str()),
        timeout,
        || async { (at_phase(env, name).await == Some(phase)).then_some(()) },
    )
    .await
}

/// The At's pod as the seed describes it: label `app: <at>`, container busybox, owned by the At,
/// held by the operator's finalizer until the At is DONE.
async fn check_at_pod(env: &Env, at: &str) -> Pod {
    let name = format!("{at}-pod");
    let pod: Pod = eventually(&format!("pod {name}"), WAIT, || get(env, &name)).await;
    let owner: At = get(env, at).await.expect("the At");
    assert_eq!(pod.labels().get("app").map(String::as_str), Some(at));
    assert_eq!(
        pod.spec.as_ref().expect("spec").containers[0].name,
        "busybox"
    );
    assert!(pod
        .owner_references()
        .iter()
        .any(|r| Some(&r.uid) == owner.uid().as_ref()));
    // The operator records DONE before it releases the finalizer: the At, read after the pod and
    // not DONE yet, proves the pod as read had to carry it (a fast kubelet may be done already).
    if owner.status.as_ref().and_then(|s| s.phase) != Some(Phase::Done) {
        assert!(
            pod.finalizers().iter().any(|f| f == FINALIZER),
            "pod {name} finalizers: {:?}",
            pod.finalizers()
        );
    }
    pod
}

/// The At ends DONE (Succeeded) and only then releases its pod.
async fn at_finishes(env: &Env, at: &str, output: Option<&str>) {
    let pod = format!("{at}-pod");
    pod_succeeds(env, &pod, output).await;
    wait_phase(env, at, Phase::Done, WAIT).await;
    let status = get::<At>(env, at)
        .await
        .and_then(|a| a.status)
        .expect("status");
    assert_eq!(status.outcome, Some(cdn_operator::api::Outcome::Succeeded));
    eventually(&format!("finalizer of {pod} released"), WAIT, || async {
        let p: Pod = get(env, &pod).await?;
        (!p.finalizers().iter().any(|f| f == FINALIZER)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn example_at_runs_at_once_and_becomes_done() {
    let Some(mut env) = Env::new("example-at").await else {
        return;
    };
    env.start_operator().await;
    env.apply_yaml(&fixture("seed-examples/at-example.yaml"))
        .await
        .expect("example-at");
    check_at_pod(&env, "example-at").await;
    let phase = at_phase(&env, "example-at").await;
    assert!(
        matches!(phase, Some(Phase::Running | Phase::Done)),
        "phase {phase:?}"
    );
    at_finishes(&env, "example-at", Some("YAY")).await;
}

#[tokio::test]
async fn a_future_at_stays_pending_then_runs_on_time() {
    let Some(mut env) = Env::new("future-at").await else {
        return;
    };
    env.start_operator().await;
    let lead = Duration::from_secs(20);
    let due = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(lead.as_secs() as i64 + 1);
    // Whole seconds, as the seed layout writes them.
    let due = jiff::Timestamp::from_second(due.as_second()).expect("a time");
    let schedule = due.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let at: At = serde_json::from_value(json!({
        "apiVersion": "cnat.programming-kubernetes.info/v1alpha1", "kind": "At",
        "metadata": {"name": "later"}, "spec": {"schedule": schedule, "command": "echo later"},
    }))
    .expect("an At");
    env.api::<At>()
        .create(&PostParams::default(), &at)
        .await
        .expect("create the At");
    wait_phase(&env, "later", Phase::Pending, WAIT).await;
    // Until shortly before the schedule: still PENDING, no pod. (Same clock as the operator.)
    while jiff::Timestamp::now() < due - jiff::SignedDuration::from_millis(500) {
        assert_eq!(
            at_phase(&env, "later").await,
            Some(Phase::Pending),
            "PENDING before {schedule}"
        );
        assert!(
            get::<Pod>(&env, "later-pod").await.is_none(),
            "no pod before {schedule}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // On time: the pod exists within a few seconds of the schedule.
    eventually("later-pod on time", Duration::from_secs(6), || {
        get::<Pod>(&env, "later-pod")
    })
    .await;
    assert!(jiff::Timestamp::now() <= due + jiff::SignedDuration::from_secs(6));
    check_at_pod(&env, "later").await;
    at_finishes(&env, "later", Some("later")).await;
}

fn manager<'a, K: Resource>(
    obj: &'a K,
    name: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry> {
    obj.meta()
        .managed_fields
        .as_ref()?
        .iter()
        .find(|m| m.manager.as_deref() == Some(name) && m.subresource.is_none())
}

#[tokio::test]
async fn server_side_apply_owns_its_fields_reverts_hand_edits_and_leaves_others_alone() {
    let Some(mut env) = Env::new("server-side-apply").await else {
        return;
    };
    env.start_operator().await;
    env.create_cluster("foo", json!({"role": "cache", "sources": []}))
        .await
        .expect("foo");
    wait_state(&env, "foo", DEPLOYED).await;
    assert_children(&env, "foo").await;

    // Every child, and the status, are applied by the manager cdn-operator.
    let deployment: Deployment = get(&env, "foo-deployment").await.unwrap();
    let config_map: ConfigMap = get(&env, "foo-nginx").await.unwrap();
    let service: Service = get(&env, "foo").await.unwrap();
    for entry in [
        manager(&deployment, "cdn-operator"),
        manager(&config_map, "cdn-operator"),
        manager(&service, "cdn-operator"),
    ] {
        let entry = entry.expect("a managedFields entry of cdn-operator");
        assert_eq!(entry.operation.as_deref(), Some("Apply"));
    }
    let cluster: CdnCluster = get(&env, "foo").await.unwrap();
    assert!(
        cluster
            .managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some("cdn-operator")
                && m.operation.as_deref() == Some("Apply")
                && m.subresource.as_deref() == Some("status")),
        "status applied through the subresource: {:?}",
        cluster.managed_fields()
    );

    // Another manager's field is left alone, and costs the operator no write.
    let stamp = manager(&deployment, "cdn-operator").and_then(|m| m.time.clone());
    let team = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "foo-deployment", "annotations": {"example.com/team": "video"}}});
    env.api::<Deployment>()
        .patch(
            "foo-deployment",
            &PatchParams::apply("e2e-team"),
            &Patch::Apply(&team),
        )
        .await
        .expect("another manager's apply");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after: Deployment = get(&env, "foo-deployment").await.unwrap();
    assert_eq!(
        after
            .annotations()
            .get("example.com/team")
            .map(String::as_str),
        Some("video")
    );
    assert!(manager(&after, "e2e-team").is_some());
    assert_eq!(
        manager(&after, "cdn-operator").and_then(|m| m.time.clone()),
        stamp,
        "the operator did not change its fields again"
    );

    // A hand edit of an owned field is reverted.
    let original = config_map.data.clone().unwrap()["nginx.conf"].clone();
    env.api::<ConfigMap>()
        .patch(
            "foo-nginx",
            &PatchParams {
                field_manager: Some("e2e-hand-edit".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {"nginx.conf": "events {}"}})),
        )
        .await
        .expect("hand edit");
    eventually("foo-nginx restored", WAIT, || async {
        let cm: ConfigMap = get(&env, "foo-nginx").await?;
        (cm.data?.get("nginx.conf") == Some(&original)).then_some(())
    })
    .await;
    let image = json!({"spec": {"template": {"spec": {"containers": [{"name": "nginx", "image": "evil.example.com/nginx:latest"}]}}}});
    env.api::<Deployment>()
        .patch(
            "foo-deployment",
            &PatchParams {
                field_manager: Some("e2e-hand-edit".into()),
                ..Default::default()
            },
            &Patch::Strategic(image),
        )
        .await
        .expect("hand edit of the image");
    eventually("foo-deployment's image restored", WAIT, || async {
        let d: Deployment = get(&env, "foo-deployment").await?;
        let image = d
            .spec?
            .template
            .spec?
            .containers
            .into_iter()
            .find(|c| c.name == "nginx")?
            .image?;
        (image == cdn_operator::cdncluster::build::DEFAULT_IMAGE).then_some(())
    })
    .await;
    eventually("a ChildRestored Event", WAIT, || async {
        env.events()
            .await
            .into_iter()
            .find(|(n, t, r, _)| n == "foo" && r == "ChildRestored" && t == "Warning")
    })
    .await;
    let after: Deployment = get(&env, "foo-deployment").await.unwrap();
    assert_eq!(
        after
            .annotations()
            .get("example.com/team")
            .map(String::as_str),
        Some("video"),
        "still left alone"
    );
}

async fn holder(env: &Env, lease: &str) -> Option<String> {
    env.api::<Lease>()
        .get_opt(lease)
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// controller_runtime_reconcile_total of the CdnCluster controller, summed over results.
fn reconciles(env: &Env, index: usize) -> f64 {
    env.operators[index]
        .metric_sum(
            "controller_runtime_reconcile_total",
            "controller=\"cdncluster\"",
        )
        .unwrap_or(0.0)
}

#[tokio::test]
async fn leader_election_one_leads_the_other_takes_over_within_2s() {
    let Some(mut env) = Env::new("leader-election").await else {
        return;
    };
    let lease = "cdn-operator-e2e".to_string();
    let mut args = Vec::new();
    // Candidates retry every second, so a released Lease is taken within about one second.
    if let Some(flag) =
        cdn_operator_e2e::run_flag(&["--leader-election-retry-period", "--retry-period"])
    {
        args.push(format!("{flag}=1s"));
    }
    for identity in ["op-a", "op-b"] {
        let options = OperatorOptions {
            namespace: Some(env.ns.clone()),
            lease: Some((env.ns.clone(), lease.clone())),
            kubeconfig: None,
            args: args.clone(),
        };
        env.start_operator_with(identity, options).await;
    }
    let leader = eventually("a Lease holder", WAIT, || async {
        holder(&env, &lease)
            .await
            .filter(|h| h == "op-a" || h == "op-b")
    })
    .await;
    let (lead, standby) = if leader == "op-a" { (0, 1) } else { (1, 0) };

    env.create_cluster("one", json!({"role": "cache", "sources": []}))
        .await
        .expect("one");
    wait_state(&env, "one", DEPLOYED).await;
    assert_children(&env, "one").await;
    assert!(reconciles(&env, lead) > 0.0, "the leader reconciled");
    assert_eq!(
        reconciles(&env, standby),
        0.0,
        "the standby reconciles (and writes) nothing"
    );

    let other = env.operators[standby].identity.clone();
    env.operators[lead].terminate();
    let stopped = Instant::now();
    eventually(
        &format!("{other} holds the Lease"),
        Duration::from_secs(30),
        || async { (holder(&env, &lease).await.as_deref() == Some(other.as_str())).then_some(()) },
    )
    .await;
    let takeover = stopped.elapsed();
    assert!(
        takeover <= Duration::from_secs(2),
        "{other} led {takeover:?} after SIGTERM to the leader"
    );
    let exit = env.operators[lead]
        .exit_within(Duration::from_secs(30))
        .await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "the old leader exits cleanly on SIGTERM: {exit:?}"
    );
    cdn_operator_e2e::say(&format!(
        "e2e leader election: takeover {takeover:?} after SIGTERM"
    ));

    env.create_cluster("two", json!({"role": "cache", "sources": []}))
        .await
        .expect("two");
    wait_state(&env, "two", DEPLOYED).await;
    assert_children(&env, "two").await;
    assert!(reconciles(&env, standby) > 0.0, "the new leader reconciles");
}

/// The shipped manifests, rendered by kustomize.
fn shipped_manifests() -> Vec<serde_json::Value> {
    let base = cdn_operator_e2e::repository_root().join("kustomize/base");
    let output = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&base)
        .output()
        .unwrap_or_else(|e| panic!("kubectl kustomize {}: {e}", base.display()));
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        base.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8 manifests");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .collect()
}

fn shipped_named<'a>(
    manifests: &'a [serde_json::Value],
    kind: &str,
    name: &str,
) -> &'a serde_json::Value {
    manifests
        .iter()
        .find(|m| m["kind"] == kind && m["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("kustomize/base ships no {kind} {name}"))
}

/// A token of ServiceAccount `account` of `ns`, from the TokenRequest API (`kubectl create token`).
fn service_account_token(ns: &str, account: &str) -> String {
    let output = std::process::Command::new("kubectl")
        .args(["create", "token", account, "-n", ns, "--duration=10m"])
        .output()
        .expect("kubectl create token");
    assert!(
        output.status.success(),
        "kubectl create token: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("a token")
        .trim()
        .to_string()
}

/// Scrapes /metrics over HTTPS with `token` until the operator allows it (200), and checks that
/// it served the controller metrics.
async fn scrape_allowed(port: u16, token: &str, what: &str) {
    let reply = eventually(what, WAIT, || async move {
        cdn_operator_testkit::https_get(port, "/metrics", "*/*", Some(token))
            .filter(|r| r.status == 200)
    })
    .await;
    assert!(
        reply.body.contains("controller_runtime_reconcile_total"),
        "{}",
        reply.body
    );
}

/// Creates `name` as a copy of the shipped ClusterRole `shipped_name` and binds it to `subjects`;
/// both are deleted with the test's namespace.
async fn bind_shipped_cluster_role(
    env: &mut Env,
    manifests: &[serde_json::Value],
    shipped_name: &str,
    name: &str,
    subjects: serde_json::Value,
) {
    let rules = shipped_named(manifests, "ClusterRole", shipped_name)["rules"].clone();
    bind_cluster_role(env, name, rules, subjects).await;
}

/// Creates the ClusterRole `name` with `rules` and binds it to `subjects`; both are deleted with
/// the test's namespace.
async fn bind_cluster_role(
    env: &mut Env,
    name: &str,
    rules: serde_json::Value,
    subjects: serde_json::Value,
) {
    create_cluster_scoped::<ClusterRole>(env, json!({"metadata": {"name": name}, "rules": rules}))
        .await;
    create_cluster_scoped::<ClusterRoleBinding>(
        env,
        json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subjects}),
    )
    .await;
}

/// Creates a cluster-scoped `K` from `object`, deleted with the test's namespace.
async fn create_cluster_scoped<K>(env: &mut Env, object: serde_json::Value)
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&());
    let object: K = serde_json::from_value(object).unwrap();
    Api::<K>::all(env.client.clone())
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
    let gvk = GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &kind);
    env.owns_cluster_scoped(gvk, &object.name_any());
}

fn shipped<'a>(manifests: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    manifests
        .iter()
        .find(|m| m["kind"] == kind)
        .unwrap_or_else(|| panic!("kustomize/base ships no {kind}"))
}

#[tokio::test]
async fn leader_election_two_candidates_racing_for_an_expired_lease_never_both_lead() {
    use cdn_operator::runtime::leader::Leadership;
    use cdn_operator::runtime::leader::{Attempt, Config, Elector};
    let Some(env) = Env::new("leader-race").await else {
        return;
    };
    let expired: Lease = serde_json::from_value(json!({
        "metadata": {"name": "race"},
        "spec": {"holderIdentity": "pod-gone", "leaseDurationSeconds": 1,
            "renewTime": "2026-01-01T00:00:00.000000Z", "acquireTime": "2026-01-01T00:00:00.000000Z",
            "leaseTransitions": 0}
    }))
    .unwrap();
    env.api::<Lease>()
        .create(&PostParams::default(), &expired)
        .await
        .expect("an expired Lease");
    let metrics = cdn_operator::runtime::metrics::Metrics::new();
    let client = racing(env.client.clone(), 2);
    let elector = |identity: &str| {
        let config = Config {
            namespace: env.ns.clone(),
            lease_name: "race".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        Elector::new(
            client.clone(),
            config,
            Leadership::standby(),
            metrics.leader_status("race"),
        )
    };
    let (a, b) = (elector("pod-a"), elector("pod-b"));
    let (ra, rb) = tokio::join!(
        a.attempt(Duration::from_secs(10)),
        b.attempt(Duration::from_secs(10))
    );
    let leading: Vec<&str> = [("pod-a", &ra), ("pod-b", &rb)]
        .into_iter()
        .filter(|(_, r)| matches!(r, Attempt::Leading))
        .map(|(who, _)| who)
        .collect();
    assert_eq!(leading.len(), 1, "exactly one leads: {ra:?} / {rb:?}");
    let holder = holder(&env, "race").await;
    assert_eq!(
        holder.as_deref(),
        Some(leading[0]),
        "and it holds the Lease"
    );
    let loser = if leading[0] == "pod-a" { &rb } else { &ra };
    assert!(
        matches!(loser, Attempt::Failed(e) if e.contains("409") || e.contains("the object has been modified")),
        "the other was refused by the precondition: {loser:?}"
    );
}

#[tokio::test]
async fn rbac_the_shipped_roles_are_enough_for_the_whole_job() {
    let Some(mut env) = Env::new("rbac").await else {
        return;
    };
    let manifests = shipped_manifests();
    let account = shipped(&manifests, "ServiceAccount")["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let cluster_role: ClusterRole =
        serde_json::from_value(shipped_named(&manifests, "ClusterRole", "cdn-operator").clone())
            .expect("ClusterRole");
    let role: Role = serde_json::from_value(
        shipped_named(&manifests, "Role", "cdn-operator-leader-election").clone(),
    )
    .expect("Role");
    // The purge key's Role: get and patch on the one Secret the install ships, empty.
    let signing_role: Role = serde_json::from_value(
        shipped_named(&manifests, "Role", "cdn-operator-purge-signing").clone(),
    )
    .expect("Role");
    let signing_secret = shipped_named(&manifests, "Secret", "cdn-operator-purge-signing");
    // The leader election Role limits leases to one name: the operator must use it.
    let lease = role
        .rules
        .iter()
        .flatten()
        .filter(|r| r.resources.iter().flatten().any(|res| res == "leases"))
        .find_map(|r| r.resource_names.as_ref().and_then(|n| n.first().cloned()))
        .unwrap_or_else(|| "cdn-operator".into());

    let ns = env.ns.clone();
    let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": ns}]);
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
    env.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
        .expect("ServiceAccount");
    // The shipped rules under a name of this test, so a real installation is never touched.
    let unique = format!("cdn-operator-{ns}");
    bind_cluster_role(
        &mut env,
        &unique,
        json!(cluster_role.rules),
        subject.clone(),
    )
    .await;
    // The Roles of the operator's namespace (this test's, the operator's here): the Lease and the
    // purge key's Secret.
    for role in [&role, &signing_role] {
        let r: Role = serde_json::from_value(
            json!({"metadata": {"name": role.name_any()}, "rules": role.rules}),
        )
        .unwrap();
        env.api::<Role>()
            .create(&PostParams::default(), &r)
            .await
            .expect("Role");
        let rb: RoleBinding = serde_json::from_value(json!({"metadata": {"name": role.name_any()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role.name_any()}, "subjects": subject})).unwrap();
        env.api::<RoleBinding>()
            .create(&PostParams::default(), &rb)
            .await
            .expect("RoleBinding");
    }
    // The Secret as the install ships it (empty): the operator may not create it, only fill it.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": signing_secret["metadata"]["name"], "labels": signing_secret["metadata"]["labels"]},
        "type": signing_secret["type"],
    }))
    .expect("Secret");
    assert!(secret.data.is_none(), "the shipped Secret is empty");
    env.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("the purge key's Secret");

    // The secured /metrics: the operator's TokenReviews and SubjectAccessReviews.
    bind_shipped_cluster_role(
        &mut env,
        &manifests,
        "cdn-operator-metrics-auth",
        &format!("cdn-operator-metrics-auth-{ns}"),
        subject.clone(),
    )
    .await;

    // The operator's client impersonates the ServiceAccount (kubeconfig `as:`).
    let kubeconfig = cdn_operator_e2e::impersonating(
        kube::config::Kubeconfig::read().expect("the kubeconfig"),
        &format!("system:serviceaccount:{ns}:{account}"),
    )
    .expect("an impersonating kubeconfig");
    let path = env.dir.path().join("impersonating.kubeconfig");
    std::fs::write(
        &path,
        serde_yaml::to_string(&kubeconfig).expect("kubeconfig YAML"),
    )
    .expect("write kubeconfig");
    let options = OperatorOptions {
        namespace: Some(ns.clone()),
        lease: Some((ns.clone(), lease.clone())),
        kubeconfig: Some(path.clone()),
        args: vec!["--metrics-secure=true".into()],
    };
    env.start_operator_with("as-service-account", options).await;

    // The whole job: leadership, the purge key, the seed topology, an invalid spec, a restore, an
    // At, a CdnPurge, Events.
    eventually("the operator leads", WAIT, || async {
        (holder(&env, &lease).await.as_deref() == Some("as-service-account")).then_some(())
    })
    .await;
    // It filled the shipped Secret with its purge key (get, then a patch of that one Secret).
    let key = cdn_operator::purge::signing::KEY_ENTRY;
    eventually("the purge key in the shipped Secret", WAIT, || async {
        let secret: Secret = get(&env, &secret.name_any()).await?;
        secret
            .data?
            .get(key)
            .filter(|k| !k.0.is_empty())
            .map(|_| ())
    })
    .await;
    for name in [
        "cdncluster-balancer",
        "cdncluster-cache-live",
        "cdncluster-cache-vod",
    ] {
        env.apply_yaml(&seed(name)).await.expect(name);
    }
    for name in ["balancer", "cache-live", "cache-vod"] {
        wait_state(&env, name, DEPLOYED).await;
        assert_children(&env, name).await;
    }
    env.create_cluster(
        "self",
        json!({"role": "cache", "sources": [{"name": "self"}]}),
    )
    .await
    .expect("self");
    wait_state(&env, "self", &[State::Invalid]).await;
    env.api::<Deployment>()
        .delete("cache-vod-deployment", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("cache-vod-deployment restored", WAIT, || async {
        get::<Deployment>(&env, "cache-vod-deployment")
            .await
            .filter(|d| d.metadata.deletion_timestamp.is_none())
    })
    .await;
    // A cache turned balancer: its headless Service is deleted and created with an address.
    env.api::<CdnCluster>()
        .patch(
            "cache-vod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"role": "balancer"}})),
        )
        .await
        .expect("cache-vod turned balancer");
    eventually("Service cache-vod with an address", WAIT, || async {
        get::<Service>(&env, "cache-vod").await.filter(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.cluster_ip.as_deref())
                .is_some_and(|ip| ip != "None")
        })
    })
    .await;
    env.apply_yaml(&fixture("seed-examples/at-example.yaml"))
        .await
        .expect("example-at");
    check_at_pod(&env, "example-at").await;
    at_finishes(&env, "example-at", Some("YAY")).await;
    // A CdnPurge, watched and its status written (one of a CdnCluster that does not exist fails
    // at once, with no pod to reach), with its Event.
    env.apply_yaml(
        "apiVersion: cluster.anevia.com/v1\nkind: CdnPurge\nmetadata: {name: nowhere}\n\
         spec: {cdnCluster: nowhere, paths: [/live/index.m3u8]}\n",
    )
    .await
    .expect("the CdnPurge");
    eventually("CdnPurge nowhere Failed", WAIT, || async {
        let purge: CdnPurge = get(&env, "nowhere").await?;
        (purge.status?.phase? == PurgePhase::Failed).then_some(())
    })
    .await;
    eventually("an Event about CdnPurge nowhere", WAIT, || async {
        env.events()
            .await
            .iter()
            .any(|(name, _, _, _)| name == "nowhere")
            .then_some(())
    })
    .await;
    assert!(!env.events().await.is_empty(), "Events were published");
    // The uninstall step (the chart's pre-delete hook, run as this ServiceAccount) on an At still
    // RUNNING: these roles are enough for it too.
    env.apply_yaml(
        "apiVersion: cnat.programming-kubernetes.info/v1alpha1\nkind: At\nmetadata: {name: long}\n\
         spec: {schedule: \"2019-04-12T10:12:00Z\", command: \"sleep 3600\"}\n",
    )
    .await
    .expect("the At");
    eventually("pod long-pod held", WAIT, || async {
        get::<Pod>(&env, "long-pod")
            .await
            .filter(|p| p.finalizers().iter().any(|f| f == FINALIZER))
    })
    .await;
    let output = std::process::Command::new(cdn_operator_e2e::operator_binary())
        .env("KUBECONFIG", &path)
        .args(["release-finalizers", &format!("--namespace={ns}")])
        .output()
        .expect("cdn-operator release-finalizers");
    assert!(
        output.status.success(),
        "release-finalizers as the ServiceAccount: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("{ns}/long-pod\n")
    );

    // A scraper with the metrics-reader role reads /metrics: the operator's reviews are allowed.
    bind_shipped_cluster_role(
        &mut env,
        &manifests,
        "cdn-operator-metrics-reader",
        &format!("cdn-operator-metrics-reader-{ns}"),
        subject.clone(),
    )
    .await;
    let token = service_account_token(&ns, &account);
    let port = env.operators[0].metrics;
    scrape_allowed(port, &token, "an authorized scrape").await;

    let logs = env.operators[0].logs();
    let forbidden: Vec<&str> = logs
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("forbidden") || l.contains(" 403") || l.contains("code: 403")
        })
        .collect();
    assert!(
        forbidden.is_empty(),
        "forbidden calls with the shipped RBAC:\n{}",
        forbidden.join("\n")
    );
}

#[tokio::test]
async fn metrics_answer_only_tokens_the_api_server_accepts_for_users_rbac_allows() {
    let Some(mut env) = Env::new("secure-metrics").await else {
        return;
    };
    let ns = env.ns.clone();
    let options = OperatorOptions {
        namespace: Some(ns.clone()),
        lease: Some((ns.clone(), "cdn-operator-secure-metrics".into())),
        kubeconfig: None,
        args: vec!["--metrics-secure=true".into()],
    };
    let index = env.start_operator_with("secure-metrics", options).await;
    let port = env.operators[index].metrics;
    let get = |token: Option<&str>| {
        cdn_operator_testkit::https_get(port, "/metrics", "*/*", token).expect("an HTTPS reply")
    };
    assert_eq!(
        cdn_operator_testkit::http_get(port, "/metrics"),
        None,
        "plain HTTP gets no answer"
    );
    assert_eq!(get(None).status, 401);
    assert_eq!(get(Some("not-a-token")).status, 401);

    let account = "scraper";
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
    env.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
        .expect("ServiceAccount");
    let token = service_account_token(&ns, account);
    let denied = get(Some(&token));
    assert_eq!(
        (denied.status, denied.body.trim()),
        (
            403,
            format!("Authorization denied for user system:serviceaccount:{ns}:{account}").as_str()
        )
    );

    let manifests = shipped_manifests();
    bind_shipped_cluster_role(
        &mut env,
        &manifests,
        "cdn-operator-metrics-reader",
        &format!("cdn-operator-metrics-reader-{ns}"),
        json!([{"kind": "ServiceAccount", "name": account, "namespace": ns}]),
    )
    .await;
    // A denial is cached for 30 s (as controller-runtime): the binding counts after that.
    let started = Instant::now();
    scrape_allowed(port, &token, "the scrape allowed once bound").await;
    eprintln!(
        "measured: 403 to 200 after the binding in {:?}",
        started.elapsed()
    );
}

/// Uninstall (docs/adr/0006-no-finalizer-left-at-uninstall.md), with an At RUNNING: a restart of
/// the operator keeps its pod's finalizer; the uninstall step (`cdn-operator release-finalizers`,
/// the chart's pre-delete hook) releases it, and the operator, still running until it goes, does
/// not take it back; so the At deleted afterwards, with no operator left, takes its pod along.
#[tokio::test]
async fn uninstall_leaves_no_pod_held_and_a_restart_keeps_the_finalizer() {
    let Some(mut env) = Env::new("uninstall").await else {
        return;
    };
    env.start_operator().await;
    env.apply_yaml(
        "apiVersion: cnat.programming-kubernetes.info/v1alpha1\nkind: At\nmetadata: {name: long}\n\
         spec: {schedule: \"2019-04-12T10:12:00Z\", command: \"sleep 3600\"}\n",
    )
    .await
    .expect("the At");
    wait_phase(&env, "long", Phase::Running, WAIT).await;
    let held = |p: &Pod| p.finalizers().iter().any(|f| f == FINALIZER);
    eventually("pod long-pod held", WAIT, || async {
        get::<Pod>(&env, "long-pod").await.filter(held)
    })
    .await;

    // A restart (as a rolling update's): the finalizer stays.
    let mut operator = env.operators.remove(0);
    operator.terminate();
    let exit = operator.exit_within(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|s| s.success()), "clean exit: {exit:?}");
    drop(operator);
    let restarted = env.start_operator().await;
    eventually("the restarted operator reconciled the At", WAIT, || async {
        let reconciles = env.operators[restarted]
            .metric_sum("controller_runtime_reconcile_total", "controller=\"at\"");
        reconciles.filter(|n| *n > 0.0)
    })
    .await;
    let pod: Pod = get(&env, "long-pod").await.expect("the pod");
    assert!(
        held(&pod),
        "a restart keeps the finalizer: {:?}",
        pod.finalizers()
    );
    assert_eq!(at_phase(&env, "long").await, Some(Phase::Running));

    // Uninstall: the hook's step while the operator still runs, then the operator goes.
    let output = std::process::Command::new(cdn_operator_e2e::operator_binary())
        .args(["release-finalizers", &format!("--namespace={}", env.ns)])
        .output()
        .expect("cdn-operator release-finalizers");
    assert!(
        output.status.success(),
        "release-finalizers: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("{}/long-pod\n", env.ns)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pod: Pod = get(&env, "long-pod").await.expect("the pod");
    assert!(!held(&pod), "not taken back: {:?}", pod.finalizers());
    let mut operator = env.operators.remove(0);
    operator.terminate();
    operator.exit_within(Duration::from_secs(30)).await;

    // With no operator left, the At is deleted: its pod goes with it, nothing stays stuck.
    env.api::<At>()
        .delete("long", &DeleteParams::background())
        .await
        .expect("the At deleted");
    eventually("the At's pod gone with it", WAIT, || async {
        get::<Pod>(&env, "long-pod").await.is_none().then_some(())
    })
    .await;
}
