//! Objects as a real API server returns them, captured into `tests/fixtures/real-server/` from
//! kube-apiserver and kube-controller-manager v1.36.2 (etcd 3.6) with the operator running: the
//! seed's three CdnClusters with their children (`kubectl get -o json --show-managed-fields`),
//! then hand edits made with the operator stopped (`kubectl patch --field-manager=kubectl-edit`,
//! `kubectl scale`). What the in-memory API cannot show: the server drops zero values
//! (`initialDelaySeconds: 0`), fills defaults, allocates a clusterIP, the deployment controller
//! writes status and an annotation, and an update moves the fields it changes to its manager.
//! The operator must take all that as it is: no write for the world it made, a restore for a
//! hand edit. `service-cache-live-with-address.json` is the cache's Service as the release before
//! headless cache Services made it (captured the same way), for the upgrade.

use cdn_operator::api::{CdnCluster, State};
use cdn_operator::cdncluster::{self, build, sources};
use cdn_operator::kubernetes::apply::{self, Change};
use cdn_operator::kubernetes::compact::Compact;
use cdn_operator::kubernetes::events::Events;
use cdn_operator::kubernetes::fields::Owned;
use cdn_operator::kubernetes::record;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;

use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::Arc;

mod support;

const CLUSTERS: [&str; 3] = ["balancer", "cache-live", "cache-vod"];

fn fixture_text(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/real-server/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn fixture(name: &str) -> Value {
    serde_json::from_str(&fixture_text(name)).expect("JSON")
}

/// The cached form of a child, read from its bytes as the watch reads them.
fn compact<K>(name: &str) -> Compact<K> {
    serde_json::from_str(&fixture_text(name)).expect("a Kubernetes object")
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
    let upstreams = sources::resolve(
        cluster,
        lookup,
        cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
    )
    .expect("the seed resolves");
    build::children(cluster, &upstreams, &Default::default(), &pod_settings())
}

/// The pods as the captured operator built them: with the purge key it made in its namespace
/// (each capture makes a new one), which every cache's ConfigMap publishes.
fn pod_settings() -> build::PodSettings {
    let published = fixture("configmap-cache-live")["data"]["purge-keys.pub"].clone();
    build::PodSettings {
        purge_keys: published.as_str().expect("the key published").into(),
        ..Default::default()
    }
}

fn change<K>(mut desired: K, observed: &str) -> Option<Change>
where
    K: kube::Resource + serde::Serialize + DeserializeOwned,
{
    apply::change(&mut desired, Some(&compact::<K>(observed).record))
}

/// What the cache reads of a child without building its metadata, as read from the whole typed
/// object: its version, generation, applied hash, controller, and the fields of the operator's
/// apply (whatever the order of an entry's keys: kubectl sorts them, the server's watch does not).
fn read_alike<K>(name: &str)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned,
{
    let object: K = typed(name);
    let meta = object.meta();
    let cached = compact::<K>(name);
    let record = &cached.record;
    assert_eq!(
        Some(&*record.version),
        meta.resource_version.as_deref(),
        "{name}"
    );
    assert_eq!(
        record.generation.map(|g| g.get()),
        meta.generation,
        "{name}"
    );
    let hash = &meta.annotations.as_ref().unwrap()[record::APPLIED_HASH_ANNOTATION];
    assert!(record.applied_hash_is(hash), "{name}");
    let entry = meta
        .managed_fields
        .iter()
        .flatten()
        .find(|e| {
            e.manager.as_deref() == Some(record::FIELD_MANAGER)
                && e.operation.as_deref() == Some("Apply")
                && e.subresource.is_none()
        })
        .expect("the operator's apply");
    let owned = Owned::of(&entry.fields_v1.as_ref().unwrap().0);
    assert_eq!(record.owned.as_deref(), Some(&owned), "{name}");
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.controller == Some(true));
    assert!(
        cached
            .metadata
            .owner_references
            .iter()
            .flatten()
            .eq(controller),
        "{name}"
    );
    assert_eq!(cached.metadata.name, meta.name);
    assert_eq!(cached.metadata.namespace, meta.namespace);

    // The server's watch writes an entry's manager and operation before its fields (the
    // fixtures, from kubectl, have its keys sorted): that order read alike.
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct WireEntry<'a> {
        manager: &'a Option<String>,
        operation: &'a Option<String>,
        api_version: &'a Option<String>,
        fields_type: &'a Option<String>,
        fields_v1: &'a Option<FieldsV1>,
        #[serde(skip_serializing_if = "Option::is_none")]
        subresource: &'a Option<String>,
    }
    let entries: Vec<WireEntry> = meta
        .managed_fields
        .iter()
        .flatten()
        .map(|e| WireEntry {
            manager: &e.manager,
            operation: &e.operation,
            api_version: &e.api_version,
            fields_type: &e.fields_type,
            fields_v1: &e.fields_v1,
            subresource: &e.subresource,
        })
        .collect();
    let mut wire = fixture(name);
    wire["metadata"]["managedFields"] = "@entries@".into();
    let text = serde_json::to_string(&wire)
        .unwrap()
        .replace("\"@entries@\"", &serde_json::to_string(&entries).unwrap());
    assert!(text.contains("{\"manager\":\"cdn-operator\",\"operation\":\"Apply\""));
    let from_wire: Compact<K> = serde_json::from_str(&text).unwrap();
    assert_eq!(from_wire.record, *record, "{name}");
}

#[test]
fn the_cache_reads_of_a_child_what_the_whole_object_holds() {
    for name in CLUSTERS {
        read_alike::<Deployment>(&format!("deployment-{name}"));
        read_alike::<ConfigMap>(&format!("configmap-{name}"));
        read_alike::<Service>(&format!("service-{name}"));
    }
    read_alike::<Deployment>("deployment-cache-vod-edited");
    read_alike::<Deployment>("deployment-cache-live-scaled");
    read_alike::<ConfigMap>("configmap-cache-vod-edited");
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
    // An address allocated to the balancer's Service; a cache's is headless.
    let s = fixture("service-balancer");
    assert!(s["spec"]["clusterIP"]
        .as_str()
        .is_some_and(|ip| ip.parse::<std::net::IpAddr>().is_ok()));
    let s = fixture("service-cache-live");
    assert_eq!(s["spec"]["clusterIPs"], serde_json::json!(["None"]));
}

#[test]
fn the_children_as_the_server_returns_them_need_no_write() {
    for name in CLUSTERS {
        let children = desired(name);
        assert_eq!(
            change(
                children.workload.deployment().cloned().unwrap(),
                &format!("deployment-{name}")
            ),
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
        change(
            vod.workload.deployment().cloned().unwrap(),
            "deployment-cache-vod-edited"
        ),
        Some(Change::Restored)
    );
    assert_eq!(
        change(vod.config_map, "configmap-cache-vod-edited"),
        Some(Change::Restored)
    );
    // `kubectl scale`: replicas moved to the scale subresource's manager.
    let live = desired("cache-live");
    assert_eq!(
        change(
            live.workload.deployment().cloned().unwrap(),
            "deployment-cache-live-scaled"
        ),
        Some(Change::Restored)
    );
}

#[test]
fn a_new_spec_is_an_update() {
    let mut cluster: CdnCluster = typed("cdncluster-cache-live");
    cluster.spec.replicas = 3;
    let children = build::children(&cluster, &[], &Default::default(), &Default::default());
    assert_eq!(
        change(
            children.workload.deployment().cloned().unwrap(),
            "deployment-cache-live"
        ),
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
        let ctx = fake.context_with(events.clone(), pod_settings()).await;
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

#[tokio::test]
async fn a_cache_service_made_with_an_address_is_created_again_headless() {
    // The world after an upgrade: cache-live's Service as the previous release applied it, with
    // an address (a clusterIP cannot change once set: an apply making it headless is refused).
    let mut objects = world(&[]);
    let owner = fixture("cdncluster-cache-live")["metadata"]["uid"].clone();
    let mut old = fixture("service-cache-live-with-address");
    old["metadata"]["ownerReferences"][0]["uid"] = owner;
    let at = objects
        .iter()
        .position(|o| o["kind"] == "Service" && o["metadata"]["name"] == "cache-live")
        .unwrap();
    objects[at] = old;
    let fake = support::FakeApi::with_objects(objects).await;
    reconcile_all(&fake).await;
    let writes: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {} {}", r.verb, r.kind, r.name))
        .collect();
    assert_eq!(
        writes,
        ["delete  cache-live", "patch Service cache-live"],
        "deleted, then applied again, and nothing else"
    );
    let api: kube::Api<Service> = kube::Api::namespaced(fake.client.clone(), "probe");
    let service = api.get("cache-live").await.unwrap();
    assert_eq!(
        service.spec.unwrap().cluster_ip.as_deref(),
        Some("None"),
        "headless"
    );
    fake.clear();
    reconcile_all(&fake).await;
    assert_eq!(fake.take_writes(), Vec::<String>::new());

    // A cache turned balancer gets an address back (a headless Service stays headless when the
    // apply leaves clusterIP out).
    kube::Api::<CdnCluster>::namespaced(fake.client.clone(), "probe")
        .patch(
            "cache-live",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"role": "balancer"}})),
        )
        .await
        .unwrap();
    fake.clear();
    reconcile_all(&fake).await;
    let deleted = fake
        .requests()
        .iter()
        .filter(|r| r.verb == "delete" && r.name == "cache-live")
        .count();
    assert_eq!(deleted, 1);
    let service = api.get("cache-live").await.unwrap();
    assert_ne!(service.spec.unwrap().cluster_ip.as_deref(), Some("None"));
}
