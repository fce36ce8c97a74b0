//! The bare-client baseline: the user's creates and the operator's writes for the same
//! CdnClusters, from one client that reads nothing, for the operator's time to be compared with.

use crate::stats::Answers;
use crate::workload::{create_all, create_namespaces, manifests};
use crate::Args;
use cdn_operator::api::CdnCluster;
use cdn_operator::cdncluster::nginx::Upstream;
use cdn_operator::cdncluster::sources::Problem;
use cdn_operator::cdncluster::status::{self, ChildChange, Observed};
use cdn_operator::cdncluster::{build, sources};
use cdn_operator::kubernetes::apply::Change;
use cdn_operator::kubernetes::events::Events;
use cdn_operator_e2e::proxy::{Counts, Proxy};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the bare-client baseline took: its time from the first create, and from its first write
/// (how it was timed before the creates counted), its requests, the server's answers to its
/// writes.
pub struct Baseline {
    pub time: Duration,
    pub from_first_write: Duration,
    pub requests: Counts,
    pub answers: Answers,
}

/// The order of the baseline's work: each CdnCluster as its create answered, once every
/// CdnCluster it names as a source has been created too, as the operator waits for its sources.
#[derive(Default)]
struct Ready {
    created: HashMap<(String, String), Arc<CdnCluster>>,
    waiting: Vec<Arc<CdnCluster>>,
}

impl Ready {
    /// The CdnClusters `created` makes ready (itself, and those that waited for it), with their
    /// sources resolved.
    fn arrived(&mut self, created: CdnCluster) -> Vec<(Arc<CdnCluster>, Vec<Upstream>)> {
        let created = Arc::new(created);
        let key = (created.namespace().unwrap_or_default(), created.name_any());
        self.created.insert(key, created.clone());
        self.waiting.push(created);
        let (all, mut ready) = (&self.created, Vec::new());
        self.waiting.retain(|cluster| {
            let ns = cluster.namespace().unwrap_or_default();
            let lookup = |name: &str| all.get(&(ns.clone(), name.to_string())).cloned();
            match sources::resolve(
                cluster,
                lookup,
                cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
            ) {
                Ok(upstreams) => {
                    ready.push((cluster.clone(), upstreams));
                    false
                }
                Err(Problem::Missing(_)) => true,
                Err(Problem::Invalid(why)) => panic!("{}: {why}", cluster.name_any()),
            }
        });
        ready
    }
}

/// The operator's writes for `cluster`, whose sources resolve to `upstreams`, through `bare`:
/// its children applied, then its status, then its Events, through the operator's own apply and
/// Event paths.
async fn write_as_the_operator(
    bare: &Client,
    events: &Events,
    cluster: &CdnCluster,
    upstreams: &[Upstream],
) {
    let ns = cluster.namespace().unwrap();
    // The children the operator under test makes: with its metrics sidecar when the environment
    // it inherits names the sidecar's image.
    // And the public purge key in each cache's ConfigMap, one of the same size as the operator's.
    static PURGE_KEYS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        cdn_operator::purge::signing::Signer::generate()
            .0
            .public_keys_file()
    });
    let pods = build::PodSettings {
        images: build::PodImages {
            nginx: std::env::var("RELATED_IMAGE_NGINX")
                .unwrap_or_else(|_| build::DEFAULT_IMAGE.into()),
            metrics: std::env::var("RELATED_IMAGE_NGINX_METRICS").ok(),
        },
        purge_keys: PURGE_KEYS.clone(),
    };
    let kids = build::children(cluster, upstreams, &Default::default(), &pods);
    let changes: Vec<ChildChange> = [
        kids.config_map.object_ref(&()),
        kids.service.object_ref(&()),
        kids.workload.deployment().cloned().unwrap().object_ref(&()),
    ]
    .into_iter()
    .map(|child| ChildChange {
        child,
        change: Change::Created,
    })
    .collect();
    use cdn_operator::kubernetes::apply::apply_always;
    apply_always(
        &Api::<ConfigMap>::namespaced(bare.clone(), &ns),
        kids.config_map,
    )
    .await
    .expect("ConfigMap");
    apply_always(&Api::<Service>::namespaced(bare.clone(), &ns), kids.service)
        .await
        .expect("Service");
    let deployment = apply_always(
        &Api::<Deployment>::namespaced(bare.clone(), &ns),
        kids.workload.deployment().cloned().unwrap(),
    )
    .await
    .expect("Deployment");
    let observed = Observed::Deployed(Some(&deployment), None);
    let now = Time(jiff::Timestamp::now());
    let status = status::desired(cluster, observed, &now);
    let notices = status::notices(cluster, &status, &observed, &changes);
    cdn_operator::kubernetes::apply::apply_status(
        &Api::<CdnCluster>::namespaced(bare.clone(), &ns),
        cluster,
        None,
        &status,
    )
    .await
    .expect("status");
    for notice in notices {
        events.publish(cluster, notice).await;
    }
}

/// The baseline: the user's creates and the operator's writes for the same CdnClusters
/// (children, then status, then the Event, through its own apply and Event paths), into fresh
/// namespaces labelled `label`. The creates go as in the operator's phase (`create_all`, on
/// their own, timed from the first); one client, `bare`, writes for each CdnCluster as soon as
/// it is ready (`Ready`), through the proxy at the operator's concurrency. It reads nothing: the
/// CdnClusters are as their creation answered them, as the operator finds them in its cache.
pub async fn run_baseline(
    client: &Client,
    proxy: &Proxy,
    bare: &Client,
    (namespaces, label): (&[String], &str),
    args: &Args,
) -> Baseline {
    eprintln!("bench: baseline");
    create_namespaces(client, namespaces, label).await;
    let manifests = manifests(args.clusters, namespaces, args.replicas);
    let events = Events::new(bare.clone(), None);
    let counts_at_start = proxy.counts();
    let writes_mark = proxy.writes_answered();
    let (ready_tx, ready_rx) = futures::channel::mpsc::unbounded();
    let start = Instant::now();
    let creates = tokio::spawn({
        let client = client.clone();
        async move {
            let mut order = Ready::default();
            let mut created = std::pin::pin!(create_all(&client, &manifests));
            while let Some(cluster) = created.next().await {
                for ready in order.arrived(cluster) {
                    ready_tx
                        .unbounded_send(ready)
                        .expect("the baseline's writer");
                }
            }
            order.waiting.len()
        }
    });
    let first_write = std::sync::OnceLock::new();
    ready_rx
        .for_each_concurrent(
            args.max_concurrent_reconciles as usize,
            |(cluster, upstreams)| {
                let (events, first_write) = (&events, &first_write);
                async move {
                    first_write.get_or_init(Instant::now);
                    write_as_the_operator(bare, events, &cluster, &upstreams).await;
                }
            },
        )
        .await;
    let end = Instant::now();
    let time = end - start;
    let never_ready = creates.await.expect("the baseline's creates");
    assert_eq!(
        never_ready, 0,
        "CdnClusters whose sources were never created"
    );
    let from_first_write = first_write.get().map_or(time, |at| end - *at);
    Baseline {
        time,
        from_first_write,
        requests: proxy.counts().since(&counts_at_start),
        answers: Answers::of(&proxy.write_times_since(writes_mark), time),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::manifest;

    #[test]
    fn the_baseline_writes_a_balancer_once_its_caches_are_created() {
        let namespaces = ["a".to_string()];
        let mut order = Ready::default();
        let names = |ready: Vec<(Arc<CdnCluster>, Vec<Upstream>)>| {
            ready
                .into_iter()
                .map(|(c, upstreams)| (c.name_any(), upstreams.len()))
                .collect::<Vec<_>>()
        };
        // The balancer is created first, as in the operator's phase: it waits for its nine caches.
        assert_eq!(names(order.arrived(manifest(0, &namespaces, 1))), vec![]);
        for i in 1..9 {
            let cache = names(order.arrived(manifest(i, &namespaces, 1)));
            assert_eq!(cache, vec![(format!("c0-{i}"), 1)]);
        }
        assert_eq!(order.waiting.len(), 1);
        assert_eq!(
            names(order.arrived(manifest(9, &namespaces, 1))),
            vec![("b0".to_string(), 9), ("c0-9".to_string(), 1)]
        );
        assert!(order.waiting.is_empty());
    }
}
