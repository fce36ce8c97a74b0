//! The CdnClusters of the node tests: applying one as a user would, its pods' selector, and the
//! wait until it runs (its status, its Deployment or StatefulSet and its pods). Depends on `wait`.

use super::wait::ready_pods;
use crate::{eventually, USER_MANAGER};
use cdn_operator::api::{CdnCluster, State};
use cdn_operator::cdncluster::build;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use kube::Client;
use serde_json::json;
use std::time::Duration;

/// Server-side applies CdnCluster `name` of `ns` with `spec` (raw JSON), as a user would.
pub async fn apply_cluster(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))
    .expect("a CdnCluster");
    let resource = ApiResource::erase::<CdnCluster>(&());
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
        .patch(
            name,
            &PatchParams::apply(USER_MANAGER),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("CdnCluster {ns}/{name}: {e}"));
}

/// The pods of CdnCluster `name` (the seed's label `deployment: <name>-deployment`).
pub fn cluster_pods(name: &str) -> String {
    format!("deployment={name}-deployment")
}

/// Waits until CdnCluster `name` of `ns` is `Running` for its current generation with its
/// `Ready` condition `True`, its Deployment available with every replica updated, and its
/// `replicas` pods Ready: those pods. A cache with a volume: its StatefulSet rolled out instead.
pub async fn cluster_running(client: &Client, ns: &str, name: &str, within: Duration) -> Vec<Pod> {
    let clusters: Api<CdnCluster> = Api::namespaced(client.clone(), ns);
    let replicas = eventually(
        &format!("CdnCluster {ns}/{name} Running and Ready"),
        within,
        || async {
            let cluster = clusters.get_opt(name).await.ok()??;
            let status = cluster.status.as_ref()?;
            let current = status.observed_generation == cluster.metadata.generation;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (current && ready && status.state == Some(State::Running)).then(|| {
                (
                    cluster.spec.replicas,
                    build::persistent_volume(&cluster).is_some(),
                )
            })
        },
    )
    .await;
    let (replicas, stateful) = replicas;
    if stateful {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        eventually(
            &format!("StatefulSet {ns}/{name} rolled out"),
            within,
            || async {
                let s = sets.get_opt(name).await.ok()??;
                let status = s.status?;
                let all = status.updated_replicas == Some(replicas)
                    && status.ready_replicas == Some(replicas)
                    && status.replicas == replicas
                    && status.current_revision == status.update_revision;
                let current = status.observed_generation == s.metadata.generation;
                (current && all).then_some(())
            },
        )
        .await;
        return ready_pods(client, ns, &cluster_pods(name), replicas as usize, within).await;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deployment = format!("{name}-deployment");
    eventually(
        &format!("Deployment {ns}/{deployment} available"),
        within,
        || async {
            let d = deployments.get_opt(&deployment).await.ok()??;
            let status = d.status?;
            let available = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True");
            let all = status.updated_replicas == Some(replicas)
                && status.ready_replicas == Some(replicas)
                && status.replicas == Some(replicas);
            (available && all).then_some(())
        },
    )
    .await;
    ready_pods(client, ns, &cluster_pods(name), replicas as usize, within).await
}
