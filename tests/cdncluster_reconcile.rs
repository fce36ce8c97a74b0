//! The CdnCluster controller against the in-memory API (kube-fake-client): the original system's
//! scenarios, invalid specs, restores, and the zero-write steady state.
//!
//! The fake serves no watches, so each step fills the controller's caches from the API, as the
//! watches would have, before reconciling.

use cdn_operator::api::{CdnCluster, CdnClusterSpec, Role, Source, State};
use cdn_operator::cdncluster::parents::Parents;
use cdn_operator::cdncluster::{self, build, Context};
use cdn_operator::kubernetes::events::{Events, Notice};
use cdn_operator::reconcile;
use cdn_operator::runtime::instrument::Reconciles;
use cdn_operator::runtime::leader::Leadership;
use cdn_operator::runtime::metrics::Metrics;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

const NS: &str = "default";

mod support;

/// The in-memory API, with a log of every write request sent to it.
struct Cluster {
    fake: support::FakeApi,
    client: Client,
    /// One recorder for the whole test, as the operator has: it folds repeated Events.
    events: Events,
}

impl Cluster {
    async fn new() -> Cluster {
        let fake = support::FakeApi::new().await;
        Cluster {
            client: fake.client.clone(),
            events: Events::new(fake.client.clone(), Some("test".into())),
            fake,
        }
    }

    /// The cache `foo` behind the balancer `bar`, both reconciled once.
    async fn foo_behind_bar() -> Cluster {
        let c = Cluster::new().await;
        c.create("foo", Role::Cache, &[]).await;
        c.create("bar", Role::Balancer, &[("foo", None)]).await;
        c.reconcile_ok("foo").await;
        c.reconcile_ok("bar").await;
        c
    }

    /// Deletes the Deployment of `cluster` as a user would.
    async fn delete_deployment(&self, cluster: &str) {
        self.api::<Deployment>()
            .delete(&build::deployment_name(cluster), &DeleteParams::default())
            .await
            .unwrap();
    }

    fn take_writes(&self) -> Vec<String> {
        self.fake.take_writes()
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Creates a CdnCluster as a user would (not one of the operator's writes).
    async fn create(&self, name: &str, role: Role, sources: &[(&str, Option<&str>)]) {
        let sources = sources
            .iter()
            .map(|(n, p)| Source::cluster(n, *p))
            .collect();
        let spec = CdnClusterSpec::new(role, sources);
        self.api::<CdnCluster>()
            .create(&PostParams::default(), &CdnCluster::new(name, spec))
            .await
            .unwrap();
        self.take_writes();
    }

    /// Changes the spec of the CdnCluster `name` as a user would (merge patch of `spec`).
    async fn patch_spec(&self, name: &str, spec: serde_json::Value) {
        self.api::<CdnCluster>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap();
        self.take_writes();
    }

    /// Annotates the Deployment of `cluster` as another manager would (a field it then owns).
    async fn annotate_deployment(&self, cluster: &str) {
        self.api::<Deployment>()
            .patch(
                &build::deployment_name(cluster),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"team": "video"}}})),
            )
            .await
            .unwrap();
        self.take_writes();
    }

    async fn get_cluster(&self, name: &str) -> CdnCluster {
        self.api::<CdnCluster>().get(name).await.unwrap()
    }

    async fn state(&self, name: &str) -> Option<State> {
        self.get_cluster(name).await.status.and_then(|s| s.state)
    }

    async fn deployment(&self, cluster: &str) -> Option<Deployment> {
        self.api::<Deployment>()
            .get_opt(&build::deployment_name(cluster))
            .await
            .unwrap()
    }

    /// Every Event published.
    async fn all_events(&self) -> Vec<Event> {
        self.api::<Event>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    /// Every Event about `name`, as (reason, note), in publication order.
    async fn events(&self, name: &str) -> Vec<(String, String)> {
        let mut events: Vec<Event> = self
            .all_events()
            .await
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        events
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// The controller's context with caches as fresh as the watches would make them.
    async fn context(&self) -> Arc<Context> {
        self.fake.context(self.events.clone()).await
    }

    async fn reconcile(&self, name: &str) -> Result<Action, cdn_operator::cdncluster::Error> {
        let obj = Arc::new(self.get_cluster(name).await);
        cdncluster::reconcile(obj, self.context().await).await
    }

    async fn reconcile_ok(&self, name: &str) {
        let action = self.reconcile(name).await.expect("reconcile");
        assert_eq!(action, Action::await_change(), "no polling");
    }

    /// The CdnClusters the controller re-reconciles when `name` changes, by name.
    async fn parents(&self, name: &str) -> Vec<String> {
        let ctx = self.context().await;
        let changed = self.get_cluster(name).await;
        let mut index = Parents::default();
        for cluster in ctx.clusters.state() {
            index.apply(None, &cluster);
        }
        let mut names: Vec<String> = index.of(&changed).into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }
}

fn note(reason: &str, note: &str) -> (String, String) {
    (reason.to_string(), note.to_string())
}

#[tokio::test]
async fn foo_and_foo2_get_their_deployments() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.create("foo2", Role::Balancer, &[]).await;
    for name in ["foo", "foo2"] {
        c.reconcile_ok(name).await;
        let d = c.deployment(name).await.expect("deployment");
        assert_eq!(d.name_any(), format!("{name}-deployment"));
        let owner = &d.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("CdnCluster", name)
        );
        assert!(c
            .api::<ConfigMap>()
            .get_opt(&format!("{name}-nginx"))
            .await
            .unwrap()
            .is_some());
        assert!(c.api::<Service>().get_opt(name).await.unwrap().is_some());
        assert_eq!(c.state(name).await, Some(State::Deploying));
        assert_eq!(
            c.events(name).await,
            [note(
                "DeploymentCreated",
                &format!("The Deployment {name}-deployment has been created")
            )]
        );
    }
}

#[tokio::test]
async fn writes_are_server_side_applies_and_status_goes_through_the_subresource() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.reconcile_ok("foo").await;
    let writes = c.take_writes();
    assert_eq!(
        writes,
        [
            "patch ConfigMap foo-nginx",
            "patch Service foo",
            "patch Deployment foo-deployment",
            "status CdnCluster foo",
            "create Event",
        ]
    );
    let status = c.get_cluster("foo").await.status.expect("status written");
    assert_eq!(status.state, Some(State::Deploying));
    assert_eq!(status.ready.as_deref(), Some("0/1"));
    // The fake applies `patch` with the apply content type only with a field manager: the
    // operator's, forced.
    let d = c.deployment("foo").await.unwrap();
    assert!(d
        .annotations()
        .contains_key(cdn_operator::kubernetes::record::APPLIED_HASH_ANNOTATION));
}

#[tokio::test]
async fn an_unchanged_world_costs_no_write() {
    let c = Cluster::foo_behind_bar().await;
    c.take_writes();
    for _ in 0..3 {
        c.reconcile_ok("foo").await;
        c.reconcile_ok("bar").await;
    }
    assert_eq!(c.take_writes(), Vec::<String>::new());

    // A field another manager sets on a child is left alone, and costs no write either.
    c.annotate_deployment("foo").await;
    c.reconcile_ok("foo").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());
    let d = c.deployment("foo").await.unwrap();
    assert_eq!(
        d.annotations().get("team").map(String::as_str),
        Some("video")
    );
}

#[tokio::test]
async fn a_deleted_deployment_is_recreated() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.reconcile_ok("foo").await;
    c.delete_deployment("foo").await;
    c.take_writes();
    c.reconcile_ok("foo").await;
    assert!(c.deployment("foo").await.is_some());
    assert_eq!(
        c.take_writes(),
        ["patch Deployment foo-deployment", "create Event"]
    );
    let created = note(
        "DeploymentCreated",
        "The Deployment foo-deployment has been created",
    );
    assert_eq!(c.events("foo").await, [created.clone(), created]);
}

#[tokio::test]
async fn a_hand_edit_of_an_owned_field_is_reverted() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.reconcile_ok("foo").await;
    // A hand edit takes the field from the operator (`kubectl apply --server-side
    // --force-conflicts`; a real server moves it on `kubectl edit` too, which the in-memory API
    // does not model: e2e and the real-server fixtures cover that).
    let by_hand = PatchParams::apply("kubectl").force();
    let edit = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "spec": {"template": {"spec": {"containers": [{"name": "nginx", "image": "evil:latest"}]}}}});
    c.api::<Deployment>()
        .patch("foo-deployment", &by_hand, &Patch::Apply(edit))
        .await
        .unwrap();
    let cm_edit =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"nginx.conf": "events {}"}});
    c.api::<ConfigMap>()
        .patch("foo-nginx", &by_hand, &Patch::Apply(cm_edit))
        .await
        .unwrap();
    c.take_writes();
    c.reconcile_ok("foo").await;
    assert_eq!(
        c.take_writes(),
        [
            "patch ConfigMap foo-nginx",
            "patch Deployment foo-deployment",
            "create Event",
            "create Event"
        ]
    );
    let image = |d: Deployment| {
        d.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
    };
    assert_eq!(
        image(c.deployment("foo").await.unwrap()).as_deref(),
        Some(build::DEFAULT_IMAGE)
    );
    let cm = c.api::<ConfigMap>().get("foo-nginx").await.unwrap();
    assert!(cm.data.unwrap()["nginx.conf"].contains("proxy_cache_path"));
    let reasons: Vec<String> = c.events("foo").await.into_iter().map(|e| e.0).collect();
    assert_eq!(
        reasons,
        ["DeploymentCreated", "ChildRestored", "ChildRestored"]
    );
    // Each names its child as the server answered the write: kind, name and uid.
    let mut related: Vec<_> = c
        .all_events()
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ChildRestored"))
        .map(|e| {
            let r = e.related.unwrap();
            (r.kind.unwrap(), r.name.unwrap(), r.uid)
        })
        .collect();
    related.sort();
    let uid = |meta: ObjectMeta| meta.uid;
    let deployment = c.deployment("foo").await.unwrap().metadata;
    let config_map = c
        .api::<ConfigMap>()
        .get("foo-nginx")
        .await
        .unwrap()
        .metadata;
    assert!(deployment.uid.is_some());
    assert_eq!(
        related,
        [
            ("ConfigMap".into(), "foo-nginx".into(), uid(config_map)),
            (
                "Deployment".into(),
                "foo-deployment".into(),
                uid(deployment)
            ),
        ]
    );
}

#[tokio::test]
async fn foo3_waits_for_asource_then_deploys() {
    let c = Cluster::new().await;
    c.create("foo3", Role::Balancer, &[("asource", None)]).await;
    c.reconcile_ok("foo3").await;
    assert!(
        c.deployment("foo3").await.is_none(),
        "no Deployment while a source is missing"
    );
    assert_eq!(c.state("foo3").await, Some(State::WaitingSource));
    let waiting = note(
        "SourceNotFound",
        "Source asource not found, will retry later",
    );
    assert_eq!(c.events("foo3").await, std::slice::from_ref(&waiting));
    let cluster = c.get_cluster("foo3").await;
    let sources_ready = cdn_operator::reconcile::conditions::find(
        &cluster.status.unwrap().conditions,
        "SourcesReady",
    )
    .cloned()
    .unwrap();
    assert_eq!(
        (sources_ready.status.as_str(), sources_ready.reason.as_str()),
        ("False", "SourceNotFound")
    );

    // Reconciling again while waiting: no Event, no write.
    c.take_writes();
    c.reconcile_ok("foo3").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());
    assert_eq!(c.events("foo3").await, std::slice::from_ref(&waiting));

    // asource appears: it deploys, and its change re-reconciles foo3, which deploys too.
    c.create("asource", Role::Cache, &[]).await;
    assert_eq!(c.parents("asource").await, ["foo3"]);
    c.reconcile_ok("asource").await;
    assert!(c.deployment("asource").await.is_some());
    c.reconcile_ok("foo3").await;
    assert!(c.deployment("foo3").await.is_some());
    assert_eq!(c.state("foo3").await, Some(State::Deploying));
    assert_eq!(
        c.events("foo3").await,
        [
            waiting,
            note(
                "DeploymentCreated",
                "The Deployment foo3-deployment has been created"
            )
        ]
    );
    let cm = c.api::<ConfigMap>().get("foo3-nginx").await.unwrap();
    assert!(cm.data.unwrap()["nginx.conf"]
        .contains("server asource.default.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;"));
}

#[tokio::test]
async fn seed_examples_in_order_give_the_seed_event_sequence() {
    let c = Cluster::new().await;
    c.create(
        "balancer",
        Role::Balancer,
        &[
            ("cache-live", Some("^/live/")),
            ("cache-vod", Some("^/vod/")),
        ],
    )
    .await;
    c.reconcile_ok("balancer").await;
    c.create("cache-live", Role::Cache, &[]).await;
    c.reconcile_ok("cache-live").await;
    for parent in c.parents("cache-live").await {
        c.reconcile_ok(&parent).await;
    }
    c.create("cache-vod", Role::Cache, &[]).await;
    c.reconcile_ok("cache-vod").await;
    for parent in c.parents("cache-vod").await {
        c.reconcile_ok(&parent).await;
    }
    assert_eq!(
        c.events("balancer").await,
        [
            note(
                "SourceNotFound",
                "Source cache-live not found, will retry later"
            ),
            note(
                "SourceNotFound",
                "Source cache-vod not found, will retry later"
            ),
            note(
                "DeploymentCreated",
                "The Deployment balancer-deployment has been created"
            ),
        ]
    );
    for cache in ["cache-live", "cache-vod"] {
        assert_eq!(
            c.events(cache).await,
            [note(
                "DeploymentCreated",
                &format!("The Deployment {cache}-deployment has been created")
            )]
        );
    }
    for name in ["balancer", "cache-live", "cache-vod"] {
        assert_eq!(c.state(name).await, Some(State::Deploying));
    }
}

#[tokio::test]
async fn parents_are_found_in_the_same_namespace_only() {
    let c = Cluster::new().await;
    c.create("a", Role::Balancer, &[("x", None)]).await;
    c.create("b", Role::Balancer, &[("x", Some("^/b"))]).await;
    c.create("x", Role::Cache, &[]).await;
    let other: Api<CdnCluster> = Api::namespaced(c.client.clone(), "other");
    let mut foreign = c.get_cluster("a").await;
    foreign.metadata = kube::api::ObjectMeta {
        name: Some("c".into()),
        namespace: Some("other".into()),
        ..Default::default()
    };
    foreign.status = None;
    other
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    assert_eq!(c.parents("x").await, ["a", "b"]);
}

#[tokio::test]
async fn the_cluster_becomes_running_when_its_replicas_are_ready() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.reconcile_ok("foo").await;
    rolled_out::<Deployment>(&c, "foo-deployment", 1).await;
    c.reconcile_ok("foo").await;
    let status = c.get_cluster("foo").await.status.unwrap();
    assert_eq!(status.state, Some(State::Running));
    assert_eq!(status.ready.as_deref(), Some("1/1"));
    assert!(cdn_operator::reconcile::conditions::is_true(
        &status.conditions,
        "Ready"
    ));
    assert_eq!(c.events("foo").await.last().unwrap().0, "Running");
}

/// Writes the status a workload's controller would once `replicas` pods of its current spec
/// are ready.
async fn rolled_out<K>(c: &Cluster, name: &str, replicas: i32)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api = c.api::<K>();
    let generation = api.get(name).await.unwrap().meta().generation;
    let status = json!({"status": {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas, "observedGeneration": generation}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    c.take_writes();
}

#[tokio::test]
async fn a_cache_given_a_volume_moves_to_a_stateful_set_and_back_never_with_fewer_ready_pods() {
    let c = Cluster::new().await;
    c.create("vod", Role::Cache, &[]).await;
    c.patch_spec("vod", json!({"replicas": 2})).await;
    c.reconcile_ok("vod").await;
    rolled_out::<Deployment>(&c, "vod-deployment", 2).await;
    c.reconcile_ok("vod").await;
    c.take_writes();

    // The volume asked: a StatefulSet beside the Deployment, which serves until its pods are
    // all ready.
    c.patch_spec(
        "vod",
        json!({"cache": {"volume": {"storageClassName": "fast"}}}),
    )
    .await;
    c.reconcile_ok("vod").await;
    let set = c.api::<StatefulSet>().get("vod").await.unwrap();
    let claims = set.spec.unwrap().volume_claim_templates.unwrap();
    let claim = claims[0].spec.as_ref().unwrap();
    assert_eq!(claim.storage_class_name.as_deref(), Some("fast"));
    assert!(
        c.deployment("vod").await.is_some(),
        "serving until replaced"
    );
    assert_eq!(
        c.take_writes(),
        [
            "patch StatefulSet vod",
            "status CdnCluster vod",
            "create Event"
        ],
        "the ConfigMap and Service unchanged"
    );
    let status = c.get_cluster("vod").await.status.unwrap();
    assert_eq!(status.ready.as_deref(), Some("0/2"), "the new pods' count");

    rolled_out::<StatefulSet>(&c, "vod", 2).await;
    c.reconcile_ok("vod").await;
    assert!(c.deployment("vod").await.is_none(), "replaced once ready");
    let status = c.get_cluster("vod").await.status.unwrap();
    assert_eq!(status.state, Some(State::Running));
    assert_eq!(status.ready.as_deref(), Some("2/2"));
    let writes = c.take_writes();
    assert_eq!(
        writes[..2],
        ["delete deployments vod-deployment", "status CdnCluster vod"],
        "{writes:?}"
    );
    c.reconcile_ok("vod").await;
    assert_eq!(c.take_writes(), Vec::<String>::new(), "steady: no write");

    // The volume removed: a Deployment again, the StatefulSet (and its claims) gone once the
    // Deployment's pods are ready.
    c.patch_spec("vod", json!({"cache": {"volume": null}}))
        .await;
    c.reconcile_ok("vod").await;
    assert!(c
        .api::<StatefulSet>()
        .get_opt("vod")
        .await
        .unwrap()
        .is_some());
    rolled_out::<Deployment>(&c, "vod-deployment", 2).await;
    c.reconcile_ok("vod").await;
    assert!(c
        .api::<StatefulSet>()
        .get_opt("vod")
        .await
        .unwrap()
        .is_none());
    assert!(c.deployment("vod").await.is_some());
}

#[tokio::test]
async fn a_spec_change_reaches_the_children() {
    let c = Cluster::new().await;
    c.create("live", Role::Cache, &[]).await;
    c.create("lb", Role::Balancer, &[("live", Some("^/live/"))])
        .await;
    c.reconcile_ok("live").await;
    c.reconcile_ok("lb").await;
    let template = |d: Deployment| d.spec.unwrap().template;
    let before = template(c.deployment("lb").await.unwrap());
    c.patch_spec(
        "lb",
        json!({"sources": [{"name": "live", "pathCondition": "^/hls/"}], "replicas": 3}),
    )
    .await;
    c.reconcile_ok("lb").await;
    assert_eq!(
        c.take_writes(),
        [
            "patch ConfigMap lb-nginx",
            // Three replicas: a drain may take one down at a time, not the cluster.
            "patch PodDisruptionBudget lb",
            "patch Deployment lb-deployment",
            "status CdnCluster lb",
            "create Event",
            "create Event"
        ]
    );
    let cm = c.api::<ConfigMap>().get("lb-nginx").await.unwrap();
    assert!(cm.data.unwrap()["nginx.conf"].contains("location ~ \"^/hls/\""));
    let d = c.deployment("lb").await.unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(
        template(d),
        before,
        "the new config is applied in place: no rollout, no cache emptied"
    );
}

#[tokio::test]
async fn cycles_and_invalid_specs_are_reported_without_children_or_loops() {
    let c = Cluster::new().await;
    c.create("a", Role::Balancer, &[("b", None)]).await;
    c.create("b", Role::Cache, &[("a", None)]).await;
    c.create("self", Role::Cache, &[("self", None)]).await;
    c.create("dup", Role::Cache, &[("a", Some("^/x")), ("a", None)])
        .await;
    for (name, message) in [
        ("a", "sources form a cycle: a → b → a"),
        ("b", "sources form a cycle: b → a → b"),
        ("self", "self lists itself as a source"),
        (
            "dup",
            "source a is listed twice: each source may appear once",
        ),
    ] {
        c.reconcile_ok(name).await;
        assert_eq!(c.state(name).await, Some(State::Invalid), "{name}");
        assert!(c.deployment(name).await.is_none(), "{name}: no children");
        assert_eq!(c.events(name).await, [note("InvalidSpec", message)]);
        let status = c.get_cluster(name).await.status.unwrap();
        let stalled = cdn_operator::reconcile::conditions::find(&status.conditions, "Stalled")
            .cloned()
            .unwrap();
        assert_eq!(
            (stalled.status.as_str(), stalled.message.as_str()),
            ("True", message)
        );
        // Reconciling again changes nothing and says nothing: no hot loop.
        c.take_writes();
        c.reconcile_ok(name).await;
        assert_eq!(c.take_writes(), Vec::<String>::new(), "{name}");
        assert_eq!(c.events(name).await.len(), 1);
    }
}

#[tokio::test]
async fn an_invalid_change_leaves_the_children_as_they_were() {
    let c = Cluster::new().await;
    c.create("a", Role::Cache, &[]).await;
    c.reconcile_ok("a").await;
    let before = c.api::<ConfigMap>().get("a-nginx").await.unwrap().data;
    c.api::<CdnCluster>()
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sources": [{"name": "a"}]}})),
        )
        .await
        .unwrap();
    c.take_writes();
    c.reconcile_ok("a").await;
    assert_eq!(c.take_writes(), ["status CdnCluster a", "create Event"]);
    assert_eq!(c.state("a").await, Some(State::Invalid));
    assert_eq!(
        c.api::<ConfigMap>().get("a-nginx").await.unwrap().data,
        before
    );
}

#[tokio::test]
async fn a_deleted_source_sends_its_parents_back_to_waiting() {
    let c = Cluster::new().await;
    c.create("cache", Role::Cache, &[]).await;
    c.create("lb", Role::Balancer, &[("cache", None)]).await;
    c.reconcile_ok("cache").await;
    c.reconcile_ok("lb").await;
    assert_eq!(c.state("lb").await, Some(State::Deploying));
    let parents = c.parents("cache").await;
    c.api::<CdnCluster>()
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    for parent in parents {
        c.reconcile_ok(&parent).await;
    }
    assert_eq!(c.state("lb").await, Some(State::WaitingSource));
    assert_eq!(
        c.events("lb").await.last().unwrap(),
        &note("SourceNotFound", "Source cache not found, will retry later")
    );
    assert!(
        c.deployment("lb").await.is_some(),
        "running children keep serving"
    );
}

#[tokio::test]
async fn api_errors_retry_with_backoff() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.fake
        .refuse("patch Deployment", 500, "etcdserver: request timed out");
    let ctx = c.context().await;
    let obj = Arc::new(c.get_cluster("foo").await);
    let error = cdncluster::reconcile(obj.clone(), ctx.clone())
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "could not apply Deployment foo-deployment: etcdserver: request timed out (500 InternalError)",
        "the error names the step and the child"
    );
    let delays: Vec<Action> = (0..3)
        .map(|_| reconcile::error_policy(obj.clone(), &error, ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [1, 2, 4].map(|s| Action::requeue(std::time::Duration::from_secs(s)))
    );
    // Success resets the backoff.
    c.fake.accept();
    cdncluster::reconcile(obj.clone(), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        reconcile::error_policy(obj, &error, ctx),
        Action::requeue(std::time::Duration::from_secs(1))
    );
}

/// The condition a user reads with `kubectl describe cdn`.
async fn condition(c: &Cluster, name: &str, type_: &str) -> (String, String, String) {
    let status = c.get_cluster(name).await.status.unwrap_or_default();
    let found = status
        .conditions
        .into_iter()
        .find(|x| x.type_ == type_)
        .expect("the condition");
    (
        found.status.into(),
        found.reason.into(),
        found.message.into(),
    )
}

#[tokio::test]
async fn a_child_the_server_refuses_is_reported_in_the_status_and_one_warning() {
    // The API server's own words, from a real v1.36 server.
    let quota = "services \"foo\" is forbidden: exceeded quota: no-services, requested: count/services=1, used: count/services=0, limited: count/services=0";
    let webhook = "admission webhook \"policy.example.com\" denied the request: images must come from registry.example.com";
    let cases = [
        ("patch Service", 403, quota, "Service foo", true),
        (
            "patch Deployment",
            422,
            webhook,
            "Deployment foo-deployment",
            true,
        ),
        (
            "patch Service",
            500,
            "failed to allocate a serviceIP: range is full",
            "Service foo",
            false,
        ),
    ];
    for (prefix, code, message, child, stalled) in cases {
        let c = Cluster::new().await;
        c.create("foo", Role::Cache, &[]).await;
        c.fake.refuse(prefix, code, message);
        for attempt in 0..3 {
            let error = c.reconcile("foo").await.unwrap_err();
            assert!(error.to_string().contains(message), "{error}");
            let writes = c.take_writes();
            assert_eq!(
                writes
                    .iter()
                    .filter(|w| w.starts_with("create Event"))
                    .count(),
                usize::from(attempt == 0),
                "one Warning per distinct message, not one per retry: {writes:?}"
            );
        }
        assert_eq!(c.state("foo").await, Some(State::Error));
        let expected = format!("{child} was refused ({code}): {message}");
        assert_eq!(
            condition(&c, "foo", "Ready").await,
            ("False".into(), "ApplyFailed".into(), expected.clone())
        );
        let (stalled_status, _, _) = condition(&c, "foo", "Stalled").await;
        let (reconciling, _, _) = condition(&c, "foo", "Reconciling").await;
        assert_eq!(
            (stalled_status.as_str(), reconciling.as_str()),
            if stalled {
                ("True", "False")
            } else {
                ("False", "True")
            }
        );
        assert_eq!(c.events("foo").await, [note("ApplyFailed", &expected)]);

        // Once the server accepts, the cluster deploys and leaves Error.
        c.fake.accept();
        c.reconcile_ok("foo").await;
        assert_eq!(c.state("foo").await, Some(State::Deploying));
        assert_eq!(condition(&c, "foo", "Stalled").await.0, "False");
    }
}

#[tokio::test]
async fn a_cluster_whose_namespace_is_being_deleted_is_left_to_go_quietly() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.fake.refuse_namespace_terminating(NS);
    let ctx = c.context().await;
    let obj = Arc::new(c.get_cluster("foo").await);
    let error = cdncluster::reconcile(obj.clone(), ctx.clone())
        .await
        .unwrap_err();
    assert!(
        reconcile::Failure::is_namespace_terminating(&error),
        "{error}"
    );
    // No status, no Event: only the refused apply (and the Service beside it).
    let writes = c.take_writes();
    assert!(
        writes
            .iter()
            .all(|w| w.starts_with("patch ConfigMap") || w.starts_with("patch Service")),
        "{writes:?}"
    );
    assert_eq!(c.get_cluster("foo").await.status, None);
    // Not retried: the cluster goes with its namespace.
    assert_eq!(
        reconcile::error_policy(obj, &error, ctx),
        Action::await_change()
    );

    // Any other refusal of a creation is retried, and reported.
    c.fake.refuse(
        "patch ConfigMap",
        403,
        "configmaps \"foo-nginx\" is forbidden: exceeded quota: no-configmaps",
    );
    let error = c.reconcile("foo").await.unwrap_err();
    assert!(!reconcile::Failure::is_namespace_terminating(&error));
    assert_eq!(c.state("foo").await, Some(State::Error));
}

#[tokio::test]
async fn the_service_goes_alongside_the_config_map_and_the_deployment_waits_for_it() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.fake
        .refuse("patch ConfigMap", 500, "etcdserver: request timed out");
    let error = c.reconcile("foo").await.unwrap_err();
    assert!(error.to_string().contains("ConfigMap foo-nginx"), "{error}");
    let writes = c.take_writes();
    let applied = |kind: &str| {
        writes
            .iter()
            .any(|w| w.starts_with(&format!("patch {kind}")))
    };
    assert!(applied("ConfigMap"), "the ConfigMap was sent");
    assert!(
        applied("Service"),
        "the Service did not wait for the ConfigMap"
    );
    assert!(
        !applied("Deployment"),
        "no rollout without its configuration"
    );
    assert!(c.api::<Service>().get_opt("foo").await.unwrap().is_some());
    assert!(c.deployment("foo").await.is_none());
}

#[tokio::test]
async fn a_cluster_deleted_while_queued_ends_quietly() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    let ctx = c.context().await;
    let stale = Arc::new(c.get_cluster("foo").await);
    c.api::<CdnCluster>()
        .delete("foo", &DeleteParams::default())
        .await
        .unwrap();
    let action = cdncluster::reconcile(stale.clone(), ctx.clone())
        .await
        .expect("no error: nothing is left to do");
    assert_eq!(action, Action::await_change(), "and no retry");
    assert_eq!(
        reconcile::error_policy(
            stale,
            &cdn_operator::cdncluster::Error::WriteStatus(
                kube::Error::LinesCodecMaxLineLengthExceeded
            ),
            ctx
        ),
        Action::requeue(std::time::Duration::from_secs(1)),
        "no backoff was accumulated"
    );
}

#[tokio::test]
async fn a_standby_replica_writes_nothing() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    // The runtime calls every reconcile through this gate; on a standby it does not call it.
    let gate = Reconciles::new(
        Metrics::new().controller(cdncluster::CONTROLLER, 1),
        Leadership::standby(),
    );
    let obj = Arc::new(c.get_cluster("foo").await);
    gate.run(obj, c.context().await, cdncluster::reconcile)
        .await
        .unwrap();
    assert_eq!(c.take_writes(), Vec::<String>::new());
    assert!(c.deployment("foo").await.is_none());
}

#[tokio::test]
async fn a_pool_waits_for_every_member_then_deploys_one_hashed_upstream() {
    let c = Cluster::new().await;
    c.create(
        "balancer",
        Role::Balancer,
        &[("cache-a", None), ("cache-b", None)],
    )
    .await;
    c.create("cache-a", Role::Cache, &[]).await;
    c.reconcile_ok("balancer").await;
    assert_eq!(c.state("balancer").await, Some(State::WaitingSource));
    assert!(c.deployment("balancer").await.is_none());
    assert_eq!(
        condition(&c, "balancer", "Ready").await.2,
        "Source cache-b not found, will retry later"
    );

    c.create("cache-b", Role::Cache, &[]).await;
    assert_eq!(c.parents("cache-b").await, ["balancer"]);
    c.reconcile_ok("balancer").await;
    assert_eq!(c.state("balancer").await, Some(State::Deploying));
    let conf = c
        .api::<ConfigMap>()
        .get("balancer-nginx")
        .await
        .unwrap()
        .data
        .unwrap()["nginx.conf"]
        .clone();
    assert_eq!(conf.matches("upstream source_").count(), 1, "{conf}");
    for line in [
        "hash $host$uri$cdn_key_args consistent;",
        "server cache-a.default.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;",
        "server cache-b.default.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;",
        "# default pool cache-a + cache-b",
    ] {
        assert!(conf.contains(line), "{line} missing in\n{conf}");
    }

    // A member that cannot share the pool's location: Invalid, the pool named by its members,
    // one Warning, the children left serving as they were.
    c.api::<CdnCluster>()
        .patch(
            "balancer",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sources": [
                {"name": "cache-a"},
                {"name": "cache-b"},
                {"name": "web", "origin": {"url": "https://web.example.com"}},
            ]}})),
        )
        .await
        .unwrap();
    c.take_writes();
    c.reconcile_ok("balancer").await;
    assert_eq!(
        c.take_writes(),
        ["status CdnCluster balancer", "create Event"]
    );
    assert_eq!(c.state("balancer").await, Some(State::Invalid));
    let message = "pool cache-a + cache-b + web (default) cannot be balanced: cache-a is reached \
                   over http with the client's Host but web is the URL origin \
                   https://web.example.com; a pool's members must all be CdnClusters or Service \
                   origins, or URL origins of the same scheme, host and path";
    assert_eq!(
        condition(&c, "balancer", "Ready").await,
        ("False".into(), "InvalidSpec".into(), message.into())
    );
    assert_eq!(
        c.events("balancer").await.last(),
        Some(&note("InvalidSpec", message))
    );
    assert_eq!(
        c.api::<ConfigMap>()
            .get("balancer-nginx")
            .await
            .unwrap()
            .data
            .unwrap()["nginx.conf"],
        conf
    );
}

/// Events are published as kube's Recorder publishes them: a new Event for a new notice, a repeat
/// within the window counted in the first one's series, and a different note a new Event.
#[tokio::test]
async fn a_repeated_event_counts_in_its_series_and_another_note_is_a_new_event() {
    let c = Cluster::new().await;
    let mut cluster = CdnCluster::new("lb", CdnClusterSpec::new(Role::Balancer, vec![]));
    cluster.metadata.namespace = Some("default".into());
    cluster.metadata.uid = Some("uid-lb".into());
    let missing = |name: &str| Notice::normal("SourceNotFound", format!("{name} not found"));
    c.events.publish(&cluster, missing("a")).await;
    c.events.publish(&cluster, missing("a")).await;
    c.events.publish(&cluster, missing("b")).await;

    let events: Vec<Event> = c
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut seen: Vec<(String, Option<i32>)> = events
        .iter()
        .map(|e| (e.note.clone().unwrap(), e.series.as_ref().map(|s| s.count)))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("a not found".to_string(), Some(2)),
            ("b not found".to_string(), None)
        ]
    );
    let a = events
        .iter()
        .find(|e| e.note.as_deref() == Some("a not found"))
        .unwrap();
    assert_eq!(a.reason.as_deref(), Some("SourceNotFound"));
    assert_eq!(a.action.as_deref(), Some("Reconcile"));
    assert_eq!(a.type_.as_deref(), Some("Normal"));
    assert_eq!(a.reporting_controller.as_deref(), Some("cdn-operator"));
    assert_eq!(a.reporting_instance.as_deref(), Some("test"));
    let regarding = a.regarding.as_ref().unwrap();
    assert_eq!(
        (
            regarding.kind.as_deref(),
            regarding.name.as_deref(),
            regarding.uid.as_deref()
        ),
        (Some("CdnCluster"), Some("lb"), Some("uid-lb"))
    );
    assert!(a.metadata.name.as_deref().unwrap().starts_with("lb."));
    assert!(a.event_time.is_some());
}

#[tokio::test]
async fn a_reconcile_finding_what_the_last_one_left_writes_nothing() {
    let c = Cluster::foo_behind_bar().await;
    c.take_writes();

    // The reconciles their own writes trigger find the caches at what they left.
    c.reconcile_ok("foo").await;
    c.reconcile_ok("bar").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());

    // Another manager's change to a child is read again (here it costs no write).
    c.annotate_deployment("foo").await;
    c.reconcile_ok("foo").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());

    // A change of a source: its parent reads it again, the source deploys it.
    c.patch_spec("foo", json!({"replicas": 2})).await;
    c.take_writes();
    c.reconcile_ok("bar").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());
    c.reconcile_ok("foo").await;
    assert_eq!(
        c.take_writes(),
        [
            "patch PodDisruptionBudget foo",
            "patch Deployment foo-deployment",
            "status CdnCluster foo",
            "create Event"
        ]
    );

    // A deleted child is re-created, right after a reconcile that found nothing to do.
    c.reconcile_ok("foo").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());
    c.delete_deployment("foo").await;
    c.take_writes();
    c.reconcile_ok("foo").await;
    assert!(c.deployment("foo").await.is_some());
}

#[tokio::test]
async fn a_spec_changed_during_a_reconcile_is_reconciled_after_it() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    // The controller took the CdnCluster from its cache; its spec changes before the status
    // write answers, so the answer holds a spec this reconcile did not deploy.
    let taken = Arc::new(c.get_cluster("foo").await);
    c.patch_spec("foo", json!({"replicas": 3})).await;
    let changed = c.get_cluster("foo").await;
    assert_ne!(
        changed.metadata.generation, taken.metadata.generation,
        "the in-memory API counts generations as a server does"
    );
    let action = cdncluster::reconcile(taken, c.context().await).await;
    assert_eq!(action.expect("reconcile"), Action::await_change());
    let replicas = |d: Deployment| d.spec.unwrap().replicas;
    assert_eq!(replicas(c.deployment("foo").await.unwrap()), Some(1));

    // The change's own event triggers the next reconcile, which deploys it.
    c.reconcile_ok("foo").await;
    assert_eq!(replicas(c.deployment("foo").await.unwrap()), Some(3));
    c.take_writes();
    c.reconcile_ok("foo").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());
}

#[tokio::test]
async fn a_failed_reconcile_is_retried_whole() {
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.reconcile_ok("foo").await;
    c.delete_deployment("foo").await;
    c.fake
        .refuse("patch Deployment", 500, "etcdserver: request timed out");
    assert!(c.reconcile("foo").await.is_err());
    c.fake.accept();
    c.reconcile_ok("foo").await;
    assert!(c.deployment("foo").await.is_some());
}

/// A cluster with more than one replica has a PodDisruptionBudget (at most one pod down by
/// default), created without an Event as it grows; scaled down to one replica, the operator
/// deletes it; nothing is written again after each change.
#[tokio::test]
async fn a_cluster_of_several_replicas_has_a_disruption_budget_until_it_has_one() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let c = Cluster::new().await;
    c.create("foo", Role::Cache, &[]).await;
    c.reconcile_ok("foo").await;
    let budgets = c.api::<PodDisruptionBudget>();
    assert!(
        budgets.get_opt("foo").await.unwrap().is_none(),
        "one replica: none"
    );
    c.take_writes();

    c.patch_spec("foo", json!({"replicas": 4})).await;
    c.reconcile_ok("foo").await;
    let writes = c.take_writes();
    assert!(
        writes.contains(&"patch PodDisruptionBudget foo".to_string()),
        "{writes:?}"
    );
    let budget = budgets.get("foo").await.unwrap().spec.unwrap();
    assert_eq!(budget.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(
        budget.selector.unwrap().match_labels.unwrap(),
        std::collections::BTreeMap::from([("deployment".into(), "foo-deployment".into())])
    );
    assert_eq!(
        budget.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    let reasons: Vec<String> = c.events("foo").await.into_iter().map(|(r, _)| r).collect();
    // The Deployment's new replica count is an update; the budget is new, not restored.
    assert_eq!(
        reasons,
        ["DeploymentCreated", "ChildUpdated"],
        "{reasons:?}"
    );
    c.reconcile_ok("foo").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());

    c.patch_spec("foo", json!({"pods": {"maxUnavailable": "50%"}}))
        .await;
    c.reconcile_ok("foo").await;
    assert_eq!(
        budgets
            .get("foo")
            .await
            .unwrap()
            .spec
            .unwrap()
            .max_unavailable,
        Some(IntOrString::String("50%".into()))
    );
    c.take_writes();

    c.patch_spec("foo", json!({"replicas": 1})).await;
    c.reconcile_ok("foo").await;
    let writes = c.take_writes();
    assert!(
        writes.contains(&"delete poddisruptionbudgets foo".to_string()),
        "{writes:?}"
    );
    assert!(budgets.get_opt("foo").await.unwrap().is_none());
    c.reconcile_ok("foo").await;
    assert_eq!(c.take_writes(), Vec::<String>::new(), "deleted once");
}

/// An Ingress exists while the balancer's spec asks for one, follows the spec, and is deleted
/// once the spec drops it; nothing is written again after each change.
#[tokio::test]
async fn a_balancer_has_its_ingress_while_its_spec_asks_for_one() {
    use k8s_openapi::api::networking::v1::Ingress;
    let c = Cluster::new().await;
    c.create("edge", Role::Balancer, &[]).await;
    c.reconcile_ok("edge").await;
    c.take_writes();
    let ingresses = c.api::<Ingress>();
    assert!(ingresses.get_opt("edge").await.unwrap().is_none());

    c.patch_spec("edge", json!({"ingress": {"host": "cdn.example.com"}}))
        .await;
    c.reconcile_ok("edge").await;
    assert_eq!(
        c.take_writes(),
        ["patch Ingress edge", "status CdnCluster edge"]
    );
    let rule = &ingresses
        .get("edge")
        .await
        .unwrap()
        .spec
        .unwrap()
        .rules
        .unwrap()[0];
    assert_eq!(rule.host.as_deref(), Some("cdn.example.com"));
    let backend = rule.http.as_ref().unwrap().paths[0]
        .backend
        .service
        .clone()
        .unwrap();
    assert_eq!(
        (backend.name.as_str(), backend.port.unwrap().name.as_deref()),
        ("edge", Some("http"))
    );
    c.reconcile_ok("edge").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());

    c.patch_spec("edge", json!({"ingress": {"host": "live.example.com"}}))
        .await;
    c.reconcile_ok("edge").await;
    assert!(c.take_writes().contains(&"patch Ingress edge".to_string()));

    // Deleted by someone while the spec asks for it: restored, with a Warning.
    ingresses.delete("edge", &Default::default()).await.unwrap();
    c.take_writes();
    c.reconcile_ok("edge").await;
    assert_eq!(c.take_writes()[0], "patch Ingress edge");
    let (reason, note) = c.events("edge").await.pop().unwrap();
    assert_eq!(reason, "ChildRestored");
    assert!(
        note.starts_with("Ingress edge was deleted outside the operator"),
        "{note}"
    );

    c.patch_spec("edge", json!({"ingress": null})).await;
    c.reconcile_ok("edge").await;
    let writes = c.take_writes();
    assert!(
        writes.contains(&"delete ingresses edge".to_string()),
        "{writes:?}"
    );
    assert!(ingresses.get_opt("edge").await.unwrap().is_none());
    c.reconcile_ok("edge").await;
    assert_eq!(c.take_writes(), Vec::<String>::new(), "deleted once");
}

/// An object captured on a v1.36.2 node (`tests/fixtures/real-node/`, namespace `fail41`),
/// moved to this test's namespace.
fn real_node<K: serde::de::DeserializeOwned>(file: &str) -> K {
    let path = format!(
        "{}/tests/fixtures/real-node/{file}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    value["metadata"]["namespace"] = json!(NS);
    serde_json::from_value(value).unwrap()
}

impl Cluster {
    /// Creates the pod captured as `file` and gives it its captured status, as the ReplicaSet
    /// controller and the kubelet would (not one of the operator's writes).
    async fn kubelet_pod(&self, file: &str) -> String {
        let mut pod: k8s_openapi::api::core::v1::Pod = real_node(file);
        let status = pod.status.take();
        pod.metadata.resource_version = None;
        pod.metadata.uid = None;
        let name = pod.name_any();
        let api = self.api::<k8s_openapi::api::core::v1::Pod>();
        api.create(&PostParams::default(), &pod).await.unwrap();
        self.set_pod_status(&name, serde_json::to_value(status).unwrap())
            .await;
        name
    }

    /// Sets the status of the pod `name` as the kubelet would.
    async fn set_pod_status(&self, name: &str, status: serde_json::Value) {
        self.api::<k8s_openapi::api::core::v1::Pod>()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap();
        self.take_writes();
    }

    /// Sets the status of the Deployment of `cluster` to the one captured as `file`, as the
    /// Deployment controller would.
    async fn deployment_status_of(&self, cluster: &str, file: &str) {
        let captured: Deployment = real_node(file);
        self.api::<Deployment>()
            .patch_status(
                &build::deployment_name(cluster),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": captured.status })),
            )
            .await
            .unwrap();
        self.take_writes();
    }
}

/// A pod the kubelet cannot start, as a real node reports it: the cluster's Ready says why, with
/// one Warning; the same world, and the kubelet's next attempts, cost no write; the pod
/// recovering clears it.
#[tokio::test]
async fn a_pod_that_cannot_start_is_the_clusters_reason_once_until_it_recovers() {
    let c = Cluster::new().await;
    c.create("rootimage", Role::Cache, &[]).await;
    c.reconcile_ok("rootimage").await;
    c.take_writes();
    let pod = c.kubelet_pod("pod-rootimage").await;
    c.deployment_status_of("rootimage", "deployment-rootimage")
        .await;

    c.reconcile_ok("rootimage").await;
    let expected =
        "container nginx cannot start: container has runAsNonRoot and image will run as root";
    assert_eq!(
        condition(&c, "rootimage", "Ready").await,
        (
            "False".into(),
            "CreateContainerConfigError".into(),
            expected.into()
        )
    );
    assert_eq!(condition(&c, "rootimage", "Stalled").await.0, "False");
    assert_eq!(condition(&c, "rootimage", "Reconciling").await.0, "True");
    assert_eq!(c.state("rootimage").await, Some(State::Deploying));
    let warnings = |events: Vec<(String, String)>| {
        events
            .into_iter()
            .filter(|(reason, _)| reason == "CreateContainerConfigError")
            .collect::<Vec<_>>()
    };
    assert_eq!(
        warnings(c.events("rootimage").await),
        [note("CreateContainerConfigError", expected)]
    );
    let writes = c.take_writes();
    assert_eq!(
        writes
            .iter()
            .filter(|w| !w.starts_with("create Event"))
            .count(),
        1,
        "one status write: {writes:?}"
    );

    // The same world: nothing written.
    c.reconcile_ok("rootimage").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());
    // The kubelet's next attempt rewrites the pod's status: the same problem, nothing written.
    let mut again: k8s_openapi::api::core::v1::Pod = real_node("pod-rootimage");
    let status = again.status.as_mut().unwrap();
    status.container_statuses.as_mut().unwrap()[0]
        .state
        .as_mut()
        .unwrap()
        .waiting
        .as_mut()
        .unwrap()
        .message = Some(
        "container has runAsNonRoot and image will run as root (pod: \"rootimage-deployment-9b5b75cbf-zzzzz_default(0000)\", container: nginx)".into(),
    );
    c.set_pod_status(&pod, serde_json::to_value(&again.status).unwrap())
        .await;
    c.reconcile_ok("rootimage").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());

    // The image fixed, the pod runs: the reason goes, no Warning.
    c.set_pod_status(
        &pod,
        json!({"containerStatuses": [{"name": "nginx", "image": "x", "imageID": "",
            "ready": true, "restartCount": 0, "state": {"running": {}}}]}),
    )
    .await;
    c.reconcile_ok("rootimage").await;
    let (_, reason, message) = condition(&c, "rootimage", "Ready").await;
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("Deploying", "0/1 replicas are ready, rolling out")
    );
    assert_eq!(
        warnings(c.events("rootimage").await).len(),
        1,
        "no Warning for a recovery"
    );
}

/// A crash loop past the Deployment's progress deadline, as a real node reports it: nginx's last
/// line, and Stalled.
#[tokio::test]
async fn a_crash_loop_past_the_deadline_is_stalled_with_the_last_error_line() {
    let c = Cluster::new().await;
    c.create("crash", Role::Cache, &[]).await;
    c.reconcile_ok("crash").await;
    c.kubelet_pod("pod-crash-logs").await;
    c.deployment_status_of("crash", "deployment-crash").await;
    c.reconcile_ok("crash").await;
    let message =
        "container nginx exits with code 127: /etc/nginx/cdn/run.sh: line 28: cksum: not found";
    assert_eq!(
        condition(&c, "crash", "Ready").await,
        ("False".into(), "CrashLoopBackOff".into(), message.into())
    );
    assert_eq!(
        condition(&c, "crash", "Stalled").await,
        (
            "True".into(),
            "ProgressDeadlineExceeded".into(),
            message.into()
        )
    );
    assert_eq!(condition(&c, "crash", "Reconciling").await.0, "False");
    c.take_writes();
    c.reconcile_ok("crash").await;
    assert_eq!(c.take_writes(), Vec::<String>::new());
}

/// Pods of another cluster, or of no cluster of the operator's, are not this cluster's reason.
#[tokio::test]
async fn only_the_clusters_own_pods_are_its_reason() {
    let c = Cluster::new().await;
    c.create("nopull", Role::Cache, &[]).await;
    c.create("other", Role::Cache, &[]).await;
    c.reconcile_ok("nopull").await;
    c.reconcile_ok("other").await;
    c.kubelet_pod("pod-nopull").await;
    c.reconcile_ok("other").await;
    assert_eq!(condition(&c, "other", "Ready").await.1, "Deploying");
    c.reconcile_ok("nopull").await;
    assert_eq!(
        condition(&c, "nopull", "Ready").await,
        (
            "False".into(),
            "ImagePullBackOff".into(),
            "image localhost/does-not-exist:1.30 of container nginx cannot be pulled".into()
        )
    );
}
