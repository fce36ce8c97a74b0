//! Objects as a real API server returns them, captured into `tests/fixtures/real-server/` from
//! kube-apiserver and kube-controller-manager v1.36.2 (etcd 3.6) with the operator running: the
//! seed's three CdnClusters with their children (`kubectl get -o json --show-managed-fields`),
//! then hand edits made with the operator stopped (`kubectl patch --field-manager=kubectl-edit`,
//! `kubectl scale`). What the in-memory API cannot show: the server drops zero values
//! (`initialDelaySeconds: 0`), fills defaults, allocates a clusterIP, the deployment controller
//! writes status and an annotation, and an update moves the fields it changes to its manager.
//! The operator must take all that as it is: no write for the world it made, a restore for a
//! hand edit.

use cdn_operator::api::{CdnCluster, State};
use cdn_operator::apply::{self, Change};
use cdn_operator::cdncluster::{self, build, sources};
use cdn_operator::compact::Compact;
use cdn_operator::events::Events;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;

use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::Arc;

mod support;

const CLUSTERS: [&str; 3] = ["balancer", "cache-live", "cache-vod"];

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/real-server/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("JSON")
}

fn typed<K: DeserializeOwned>(name: &str) -> K {
    serde_json::from_value(fixture(name)).expect("a Kubernetes object")
}

fn clusters() -> Vec<Arc<CdnCluster>> {
    CLUSTERS
        .iter()
        .map(|c| Arc::new(typed(&format!("cdncluster-{c}"))))
        .collect()
}

/// The children the operator builds for `name`, its sources resolved among the fixtures.
fn desired(name: &str) -> build::Children {
    let clusters = clusters();
    let cluster = clusters.iter().find(|c| c.name_any() == name).unwrap();
    let lookup = |source: &str| clusters.iter().find(|c| c.name_any() == source).cloned();
    let upstreams = sources::resolve(cluster, lookup).expect("the seed resolves");
    build::children(cluster, &upstreams, &Default::default())
}

fn change<K>(mut desired: K, observed: &str) -> Option<Change>
where
    K: kube::Resource + serde::Serialize + DeserializeOwned,
{
    apply::change(
        &mut desired,
        Some(&Compact::of(&typed::<K>(observed)).record),
    )
}

#[test]
fn the_server_changed_values_the_operator_applied() {
    // What broke the value comparison: the zero the server drops, the defaults it adds.
    let d = fixture("deployment-cache-live");
    let container = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["readinessProbe"]["initialDelaySeconds"],
        Value::Null
    );
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        d["status"]["observedGeneration"],
        d["metadata"]["generation"]
    );
    assert!(d["metadata"]["annotations"]["deployment.kubernetes.io/revision"].is_string());
    let s = fixture("service-cache-live");
    assert!(s["spec"]["clusterIP"]
        .as_str()
        .is_some_and(|ip| !ip.is_empty()));
}

#[test]
fn the_children_as_the_server_returns_them_need_no_write() {
    for name in CLUSTERS {
        let children = desired(name);
        assert_eq!(
            change(children.deployment, &format!("deployment-{name}")),
            None,
            "{name}'s Deployment"
        );
        assert_eq!(
            change(children.config_map, &format!("configmap-{name}")),
            None,
            "{name}'s ConfigMap"
        );
        assert_eq!(
            change(children.service, &format!("service-{name}")),
            None,
            "{name}'s Service"
        );
    }
}

#[test]
fn hand_edits_on_the_real_server_are_restored() {
    // `kubectl patch` (an update) of the image: the field moved to the manager kubectl-edit.
    let vod = desired("cache-vod");
    assert_eq!(
        change(vod.deployment, "deployment-cache-vod-edited"),
        Some(Change::Restored)
    );
    assert_eq!(
        change(vod.config_map, "configmap-cache-vod-edited"),
        Some(Change::Restored)
    );
    // `kubectl scale`: replicas moved to the scale subresource's manager.
    let live = desired("cache-live");
    assert_eq!(
        change(live.deployment, "deployment-cache-live-scaled"),
        Some(Change::Restored)
    );
}

#[test]
fn a_new_spec_is_an_update() {
    let mut cluster: CdnCluster = typed("cdncluster-cache-live");
    cluster.spec.replicas = 3;
    let children = build::children(&cluster, &[], &Default::default());
    assert_eq!(
        change(children.deployment, "deployment-cache-live"),
        Some(Change::Updated)
    );
}

fn world(edited: &[&str]) -> Vec<Value> {
    let mut objects = Vec::new();
    for name in CLUSTERS {
        objects.push(fixture(&format!("cdncluster-{name}")));
        for kind in ["deployment", "configmap", "service"] {
            let fixture_name = format!("{kind}-{name}");
            let edited = edited.iter().find(|e| e.starts_with(&fixture_name));
            objects.push(fixture(edited.copied().unwrap_or(&fixture_name)));
        }
    }
    objects
}

async fn reconcile_all(fake: &support::FakeApi) {
    let events = Events::new(fake.client.clone(), Some("test".into()));
    for name in CLUSTERS {
        let ctx = fake.context(events.clone()).await;
        let cluster = ctx
            .clusters
            .get(&kube::runtime::reflector::ObjectRef::new(name).within("probe"))
            .expect("cached");
        let action = cdncluster::reconcile(cluster, ctx)
            .await
            .expect("reconcile");
        assert_eq!(action, Action::await_change());
    }
}

#[tokio::test]
async fn reconciling_the_world_as_the_server_returns_it_writes_nothing() {
    let fake = support::FakeApi::with_objects(world(&[])).await;
    reconcile_all(&fake).await;
    assert_eq!(fake.take_writes(), Vec::<String>::new());
    for name in CLUSTERS {
        let cluster: CdnCluster = kube::Api::namespaced(fake.client.clone(), "probe")
            .get(name)
            .await
            .unwrap();
        assert_eq!(cluster.status.unwrap().state, Some(State::Deploying));
    }
}

#[tokio::test]
async fn reconciling_the_hand_edited_world_restores_it_once() {
    let edited = [
        "deployment-cache-vod-edited",
        "configmap-cache-vod-edited",
        "deployment-cache-live-scaled",
    ];
    let fake = support::FakeApi::with_objects(world(&edited)).await;
    reconcile_all(&fake).await;
    assert_eq!(
        fake.take_writes(),
        [
            "patch Deployment cache-live-deployment",
            "create Event",
            "patch ConfigMap cache-vod-nginx",
            "patch Deployment cache-vod-deployment",
            "create Event",
            "create Event",
        ]
    );
    let d: Deployment = kube::Api::namespaced(fake.client.clone(), "probe")
        .get("cache-vod-deployment")
        .await
        .unwrap();
    let image = d.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some(build::DEFAULT_IMAGE));
    let cm: ConfigMap = kube::Api::namespaced(fake.client.clone(), "probe")
        .get("cache-vod-nginx")
        .await
        .unwrap();
    assert!(cm.data.unwrap()[build::CONFIG_KEY].contains("proxy_cache_path"));
}
