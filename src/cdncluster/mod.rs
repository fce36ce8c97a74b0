//! The CdnCluster controller: dereference the sources → validate → build the children → apply
//! what differs → write the status → publish the Events the change deserves.

pub mod build;
mod children;
pub mod nginx;
pub mod parents;
pub mod sources;
pub mod status;
mod written;

use crate::api::{CdnCluster, CdnClusterStatus};
use crate::kubernetes::apply;
use crate::kubernetes::arrivals::Arrivals;
use crate::kubernetes::cache::{self, OnDemand, Scope, Watches};
use crate::kubernetes::compact::Compact;
use crate::kubernetes::errors;
use crate::kubernetes::events::Events;
use crate::kubernetes::index::{Index, Reset};
use crate::kubernetes::problems::{PodProblems, PodSummary};
use crate::kubernetes::records::Records;
use crate::kubernetes::restricted::RunAs;
use crate::reconcile::{self, Shared};
use crate::runtime::leader::Leadership;
use build::{MANAGED_BY, MANAGED_BY_LABEL};
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use parents::{Parents, ParentsWatch};
use status::Observed;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use written::Written;

/// The controller's name in metrics, logs and traces.
pub const CONTROLLER: &str = "cdncluster";

/// Caches of the CdnCluster controller.
pub struct Context {
    pub shared: Shared,
    pub clusters: Store<CdnCluster>,
    /// The waits on `clusters`, woken by the CdnCluster watch.
    pub cluster_arrivals: Arrivals,
    /// Children are cached as [`Records`]: they are only compared and read for status.
    pub deployments: Records,
    /// The StatefulSets of caches with a volume, watched once a cluster has one
    /// (`stateful_set_watch`).
    pub stateful_sets: Records,
    pub stateful_set_watch: OnDemand,
    pub config_maps: Records,
    pub services: Records,
    pub pod_disruption_budgets: Records,
    pub ingresses: Records,
    /// The problems of the clusters' pods, by cluster: only pods that have one are kept.
    pub pods: PodProblems,
    /// How long a reconcile waits for its writes to reach the caches; zero where no watch fills
    /// them (tests that fill the caches by hand).
    pub writes_visible_within: Duration,
    /// The DNS domain of the cluster, in the names of the Services the CdnClusters' nginx looks up.
    pub cluster_domain: String,
    /// The pods' images and the keys their sidecars check purges with.
    pub pod_settings: build::PodSettings,
}

/// What the operator's flags set of every CdnCluster's children.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The pods' user and groups.
    pub run_as: RunAs,
    /// The pods' images and the keys their sidecars check purges with.
    pub pods: build::PodSettings,
    /// The DNS domain of the cluster.
    pub cluster_domain: String,
}

impl reconcile::Context for Context {
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

/// Builds the controller and its watches: CdnClusters, the children the operator labelled as
/// its own, and their pods (a change of a pod's problem reconciles its cluster, named by the
/// pod's instance label; `pod_readers` are fed the same events). A change of a CdnCluster also triggers the CdnClusters that list it as a source,
/// looked up in an index the CdnCluster watch keeps ([`Parents`]). After a cache lists again,
/// every CdnCluster is reconciled ([`Relists`]).
pub fn controller(
    client: Client,
    scope: &Scope,
    events: Events,
    leadership: Leadership,
    concurrency: u16,
    settings: Settings,
    pod_readers: impl Index<PodSummary>,
) -> (Arc<Context>, Controller<CdnCluster>) {
    let children = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let watches = Watches::default();
    let (deployments, deployment_events) = watches.cached_records(
        scope.api::<Compact<Deployment>>(client.clone()),
        children.clone(),
    );
    // Watched once a CdnCluster has a volume, or a pod of a StatefulSet is seen (one left by a
    // volume removed while the operator was away): every other operator pays nothing for it.
    let (stateful_sets, stateful_set_watch, stateful_set_events) = watches
        .cached_records_on_demand(
            scope.api::<Compact<StatefulSet>>(client.clone()),
            children.clone(),
        );
    let (config_maps, config_map_events) = watches.cached_records(
        scope.api::<Compact<ConfigMap>>(client.clone()),
        children.clone(),
    );
    let (services, service_events) = watches.cached_records(
        scope.api::<Compact<Service>>(client.clone()),
        children.clone(),
    );
    let (pod_disruption_budgets, budget_events) = watches.cached_records(
        scope.api::<Compact<PodDisruptionBudget>>(client.clone()),
        children.clone(),
    );
    let (ingresses, ingress_events) =
        watches.cached_records(scope.api::<Compact<Ingress>>(client.clone()), children);
    let pods = PodProblems::default();
    let pod_events = watches
        .indexed(
            scope.api::<PodSummary>(client.clone()),
            watcher::Config::default().labels(&build::pod_watch_selector()),
            (
                (pods.writer(), StatefulSetPods(stateful_set_watch.clone())),
                pod_readers,
            ),
        )
        .try_filter(|event| futures::future::ready(tells(event)));

    let (parents_tx, parents_rx) = mpsc::unbounded_channel();
    let cluster_arrivals = Arrivals::default();
    let (clusters, cluster_events) = watches.cached(
        scope.api::<CdnCluster>(client.clone()),
        watcher::Config::default(),
        &cluster_arrivals,
        |cache| ParentsWatch {
            index: Parents::default(),
            cache: cache.clone(),
            parents: parents_tx,
        },
    );

    let controller = Controller::for_stream(cluster_events.applied_objects(), clusters.clone())
        .owns_stream(deployment_events.touched_objects())
        .owns_stream(stateful_set_events.touched_objects())
        .owns_stream(config_map_events.touched_objects())
        .owns_stream(service_events.touched_objects())
        .owns_stream(budget_events.touched_objects())
        .owns_stream(ingress_events.touched_objects())
        .watches_stream(pod_events.touched_objects(), cluster_of)
        .reconcile_on(UnboundedReceiverStream::new(parents_rx))
        .reconcile_all_on(leadership.acquired())
        .reconcile_all_on(watches.relists.listed_again())
        .with_config(Config::default().concurrency(concurrency));

    let ready = watches.ready;
    let context = Arc::new(Context {
        shared: Shared {
            run_as: settings.run_as,
            ..Shared::new(client, events, ready)
        },
        clusters,
        cluster_arrivals,
        deployments,
        stateful_sets,
        stateful_set_watch,
        config_maps,
        services,
        pod_disruption_budgets,
        ingresses,
        pods,
        writes_visible_within: cache::WRITES_VISIBLE_WITHIN,
        cluster_domain: settings.cluster_domain,
        pod_settings: settings.pods,
    });
    (context, controller)
}

/// Starts the StatefulSets' watch when a pod of a StatefulSet is seen: one of a cache with a
/// volume, or one the operator must delete (its cluster's volume removed while it was away).
struct StatefulSetPods(OnDemand);

impl Index<PodSummary> for StatefulSetPods {
    fn apply(&mut self, pod: &PodSummary) -> bool {
        if pod.stateful {
            self.0.want();
        }
        false
    }

    fn delete(&mut self, _: &PodSummary) {}

    fn reset(&mut self, step: Reset<'_, PodSummary>) {
        if let Reset::Listed(pod) = step {
            self.apply(pod);
        }
    }
}

/// Whether a pod's event (one the cache said changed its problem, or a deletion) may change what
/// its cluster reports. A pod deleted without a problem does not: a rollout's old pods reconcile
/// nothing. One with a problem does (an unscheduled pod is deleted at once: its deletion is its
/// only event).
fn tells(event: &watcher::Event<PodSummary>) -> bool {
    !matches!(event, watcher::Event::Delete(pod) if pod.problem.is_none())
}

/// The CdnCluster a pod of its Deployment belongs to: the pod's instance label.
fn cluster_of(pod: PodSummary) -> Option<ObjectRef<CdnCluster>> {
    let namespace = pod.metadata.namespace.as_deref()?;
    Some(ObjectRef::new(pod.instance()?).within(namespace))
}

/// Nothing reads a CdnCluster's labels.
impl cache::Cached for CdnCluster {
    const LABELS_READ: bool = false;
}

/// Errors of a CdnCluster's reconcile, by step. Each retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Apply: the API server refused a child.
    #[error("could not apply {kind} {name}: {}", errors::describe(source))]
    ApplyChild {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Status: the API server refused the status.
    #[error("could not write the status: {}", errors::describe(.0))]
    WriteStatus(#[source] kube::Error),
}

impl Error {
    /// The error of a refused write of the child `K` named `name`, for `map_err`.
    pub fn apply_child<K: Resource<DynamicType = ()>>(
        name: String,
    ) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::ApplyChild {
            kind: K::kind(&()).to_string(),
            name,
            source,
        }
    }
}

impl reconcile::Failure for Error {
    fn request(&self) -> &kube::Error {
        match self {
            Error::ApplyChild { source, .. } | Error::WriteStatus(source) => source,
        }
    }
}

/// Reconciles one CdnCluster: dereference its sources → validate → build the children → apply
/// what differs → write the status → publish the Events.
pub async fn reconcile(cluster: Arc<CdnCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.shared.ready.wait().await;
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    // Dereference: the sources as the cache holds them.
    let lookup = |source: &str| ctx.clusters.get(&ObjectRef::new(source).within(&namespace));
    let resolved = sources::resolve(&cluster, lookup, &ctx.cluster_domain);
    let mut written = Written::new(ctx.writes_visible_within);
    // Validate → build → apply: what the status is made from. A refused child fails the
    // reconcile once the status says so.
    let (deployment, pods, refusal, failed);
    let observed = match &resolved {
        Err(problem) => {
            let why = status::describe(problem);
            tracing::info!(%namespace, %name, "CdnCluster {namespace}/{name} is not deployed: {why}");
            failed = None;
            Observed::Problem(problem)
        }
        Ok(upstreams) => {
            let desired =
                build::children(&cluster, upstreams, &ctx.shared.run_as, &ctx.pod_settings);
            match children::apply(&ctx, &namespace, desired, &mut written).await {
                Ok(last_known) => {
                    (deployment, failed) = (last_known, None);
                    pods = ctx.pods.worst(&namespace, &name);
                    Observed::Deployed(deployment.as_ref(), pods.as_ref())
                }
                // The namespace is being deleted, and the cluster with it: nothing to report.
                Err(error) if reconcile::Failure::is_namespace_terminating(&error) => {
                    return Err(error)
                }
                Err(error) => {
                    refusal = status::Refusal::of(&error, &namespace);
                    failed = Some(error);
                    Observed::Refused(&refusal)
                }
            }
        }
    };
    let status = status::desired(&cluster, observed, &Time(jiff::Timestamp::now()));
    let notices = status::notices(&cluster, &status, &observed, &written.changes);
    if !write_status(&ctx, &cluster, &status, &mut written).await? {
        // Deleted while queued: its children go with it by garbage collection.
        tracing::debug!(%namespace, %name, "deleted before its status was written");
        return Ok(Action::await_change());
    }
    // The Events go out while the caches catch up with this reconcile's writes: neither waits
    // for the other, and the reconcile holds its slot for one round trip less.
    let publish = async {
        for notice in notices {
            ctx.shared.events.publish(cluster.as_ref(), notice).await;
        }
    };
    futures::join!(publish, written.until_visible());
    if let Some(error) = failed {
        return Err(error);
    }
    ctx.shared.succeeded(cluster.as_ref());
    Ok(Action::await_change())
}

/// Status: applies `status` unless the cached CdnCluster holds it. Returns false when the
/// CdnCluster is gone.
async fn write_status(
    ctx: &Context,
    cluster: &CdnCluster,
    status: &CdnClusterStatus,
    written: &mut Written,
) -> Result<bool, Error> {
    let (namespace, name) = (cluster.namespace().unwrap_or_default(), cluster.name_any());
    let api: Api<Compact<CdnCluster>> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    let before = cluster.resource_version();
    match apply::apply_status(&api, cluster, cluster.status.as_ref(), status).await {
        Ok(Some(applied)) => {
            written.wrote(
                &ctx.clusters,
                &ctx.cluster_arrivals,
                (&namespace, &name),
                before,
                applied.resource_version(),
            );
            Ok(true)
        }
        Ok(None) => Ok(true),
        Err(error) if errors::is_not_found(&error) => Ok(false),
        Err(error) => Err(Error::WriteStatus(error)),
    }
}

#[cfg(test)]
mod tests;
