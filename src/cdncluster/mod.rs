//! The CdnCluster controller: dereference the sources → validate → build the children → apply
//! what differs → write the status → publish the Events the change deserves.

pub mod build;
pub mod nginx;
pub mod parents;
pub mod settled;
pub mod sources;
pub mod status;

use crate::api::CdnCluster;
use crate::kubernetes::apply::{self, Change};
use crate::kubernetes::cache::{self, Arrivals, Scope, Watches};
use crate::kubernetes::compact::Compact;
use crate::kubernetes::events::Events;
use crate::kubernetes::index::Versions;
use crate::kubernetes::record::Record;
use crate::kubernetes::records::Records;
use crate::kubernetes::restricted::RunAs;
use crate::reconcile::{self, Error, Shared};
use crate::runtime::leader::Leadership;
use build::{Children, MANAGED_BY, MANAGED_BY_LABEL};
use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use parents::{Parents, ParentsWatch};
use serde::de::DeserializeOwned;
use serde::Serialize;
use settled::{Settled, VersionSet};
use status::{ChildChange, Observed};
use std::cell::RefCell;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

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
    pub config_maps: Records,
    pub services: Records,
    /// How long a reconcile waits for its writes to reach the caches; zero where no watch fills
    /// them (tests that fill the caches by hand).
    pub writes_visible_within: Duration,
    /// What each CdnCluster's last successful reconcile left: a reconcile finding the same ends
    /// at once.
    pub settled: Settled,
    /// The DNS domain of the cluster, in the names of the Services the CdnClusters' nginx looks up.
    pub cluster_domain: String,
}

impl reconcile::Context for Context {
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

/// Builds the controller and its watches: CdnClusters, and the children the operator labelled as
/// its own. A change of a CdnCluster also triggers the CdnClusters that list it as a source,
/// looked up in an index the CdnCluster watch keeps ([`Parents`]). After a cache lists again,
/// every CdnCluster is reconciled ([`Relists`]).
pub fn controller(
    client: Client,
    scope: &Scope,
    events: Events,
    leadership: Leadership,
    concurrency: u16,
    run_as: RunAs,
    cluster_domain: String,
) -> (Arc<Context>, Controller<CdnCluster>) {
    let children = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let watches = Watches::default();
    let (deployments, deployment_events) = watches.cached_records(
        scope.api::<Compact<Deployment>>(client.clone()),
        children.clone(),
    );
    let (config_maps, config_map_events) = watches.cached_records(
        scope.api::<Compact<ConfigMap>>(client.clone()),
        children.clone(),
    );
    let (services, service_events) =
        watches.cached_records(scope.api::<Compact<Service>>(client.clone()), children);

    let (parents_tx, parents_rx) = mpsc::unbounded_channel();
    let cluster_arrivals = Arrivals::default();
    let settled = Settled::default();
    let (clusters, cluster_events) = watches.cached(
        scope.api::<CdnCluster>(client.clone()),
        watcher::Config::default(),
        &cluster_arrivals,
        |cache| {
            let parents = ParentsWatch {
                index: Parents::default(),
                cache: cache.clone(),
                parents: parents_tx,
            };
            (parents, settled.clone())
        },
    );

    let controller = Controller::for_stream(cluster_events.applied_objects(), clusters.clone())
        .owns_stream(deployment_events.touched_objects())
        .owns_stream(config_map_events.touched_objects())
        .owns_stream(service_events.touched_objects())
        .reconcile_on(UnboundedReceiverStream::new(parents_rx))
        .reconcile_all_on(leadership.acquired())
        .reconcile_all_on(watches.relists.listed_again())
        .with_config(Config::default().concurrency(concurrency));

    let ready = watches.ready;
    let context = Arc::new(Context {
        shared: Shared {
            run_as,
            ..Shared::new(client, events, ready)
        },
        clusters,
        cluster_arrivals,
        deployments,
        config_maps,
        services,
        writes_visible_within: cache::WRITES_VISIBLE_WITHIN,
        settled,
        cluster_domain,
    });
    (context, controller)
}

/// Nothing reads a CdnCluster's labels.
impl cache::Cached for CdnCluster {
    const LABELS_READ: bool = false;
}

/// Reconciles one CdnCluster; ends at once when nothing it reads changed since its last
/// successful reconcile ([`Settled`]).
pub async fn reconcile(cluster: Arc<CdnCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.shared.ready.wait().await;
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let result = reconcile_unless_settled(&cluster, &ctx, &namespace, &name).await;
    if result.is_err() {
        ctx.settled.forget(&namespace, &name);
    }
    result
}

/// Dereference → validate → build → apply → status, unless [`Settled`] says the versions read
/// are those the last successful reconcile left.
async fn reconcile_unless_settled(
    cluster: &Arc<CdnCluster>,
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Action, Error> {
    let looked_up = RefCell::new(Vec::new());
    let lookup = |source: &str| {
        let found = ctx.clusters.get(&ObjectRef::new(source).within(namespace));
        let version = found.as_ref().and_then(|c| c.resource_version());
        looked_up.borrow_mut().push((source.to_string(), version));
        found
    };
    let resolved = sources::resolve(cluster, lookup, &ctx.cluster_domain);
    let mut versions = VersionSet::new(cluster.resource_version(), looked_up.into_inner());
    // Kinds as `Written::child` names them, versions as the caches hold them.
    for (kind, cache, child) in [
        (
            ConfigMap::kind(&()),
            &ctx.config_maps,
            build::config_map_name(name),
        ),
        (
            Deployment::kind(&()),
            &ctx.deployments,
            build::deployment_name(name),
        ),
        (Service::kind(&()), &ctx.services, build::service_name(name)),
    ] {
        versions.set_child(kind, cache.version(namespace, &child));
    }
    if ctx.settled.unchanged(namespace, name, &versions) {
        tracing::debug!(%namespace, %name, "unchanged since its last reconcile");
        return Ok(Action::await_change());
    }
    let now = Time(jiff::Timestamp::now());
    let mut written = Written::new(ctx.writes_visible_within, versions);
    // What the status is made from; a refused child fails the reconcile once the status says so.
    let (deployment, refusal, failed);
    let observed = match &resolved {
        Err(problem) => {
            tracing::info!(%namespace, %name, ?problem, "not deploying");
            failed = None;
            Observed::Problem(problem)
        }
        Ok(upstreams) => {
            let children = build::children(cluster, upstreams, &ctx.shared.run_as);
            match apply_children(ctx, namespace, children, &mut written).await {
                Ok(last_known) => {
                    (deployment, failed) = (last_known, None);
                    Observed::Deployed(deployment.as_ref())
                }
                // The namespace is being deleted, and the cluster with it: nothing to report.
                Err(error) if error.is_namespace_terminating() => return Err(error),
                Err(error) => {
                    refusal = status::Refusal::of(&error, namespace);
                    failed = Some(error);
                    Observed::Refused(&refusal)
                }
            }
        }
    };
    let status = status::desired(cluster, observed, &now);
    let notices = status::notices(cluster, &status, &observed, &written.changes);

    let api: Api<Compact<CdnCluster>> = Api::namespaced(ctx.shared.client.clone(), namespace);
    let before = cluster.resource_version();
    match apply::apply_status(&api, cluster.as_ref(), cluster.status.as_ref(), &status).await {
        Ok(Some(applied)) => {
            // The answer's version is what this reconcile left only if it still holds the spec
            // reconciled: a spec changed meanwhile must be reconciled, not found settled.
            if applied.record.generation.map(|g| g.get()) == cluster.metadata.generation {
                written.versions.set_cluster(applied.resource_version());
            }
            written.wrote(
                &ctx.clusters,
                &ctx.cluster_arrivals,
                (namespace, name),
                before,
                applied.resource_version(),
            )
        }
        Ok(None) => {}
        Err(error) if reconcile::is_not_found(&error) => {
            // Deleted while queued: its children go with it by garbage collection.
            tracing::debug!(%namespace, %name, "deleted before its status was written");
            ctx.settled.forget(namespace, name);
            return Ok(Action::await_change());
        }
        Err(error) => return Err(Error::WriteStatus(error)),
    }
    // The Events go out while the caches catch up with this reconcile's writes: neither waits
    // for the other, and the reconcile holds its slot for one round trip less.
    let publish = async {
        for notice in notices {
            ctx.shared.events.publish(cluster.as_ref(), notice).await;
        }
    };
    let ((), versions) = futures::join!(publish, written.until_visible());
    if let Some(error) = failed {
        return Err(error);
    }
    ctx.shared.succeeded(cluster.as_ref());
    ctx.settled.settled(namespace, name, &versions);
    Ok(Action::await_change())
}

/// What a reconcile wrote: the children it changed (for the Events), for each write the wait (at
/// most `within`) until the caches show it (futures do nothing until awaited), and the versions
/// it read and left.
struct Written {
    changes: Vec<ChildChange>,
    visible: Vec<BoxFuture<'static, ()>>,
    within: Duration,
    versions: VersionSet,
}

impl Written {
    /// Nothing written yet, after reading `versions`.
    fn new(within: Duration, versions: VersionSet) -> Self {
        Written {
            changes: Vec::new(),
            visible: Vec::new(),
            within,
            versions,
        }
    }

    /// Notes a write of `namespace/name`, cached in `cache` (whose waits are `arrivals`) at
    /// version `before`, answered with `after`.
    fn wrote<C: Versions>(
        &mut self,
        cache: &C,
        arrivals: &Arrivals,
        (namespace, name): (&str, &str),
        before: Option<String>,
        after: Option<String>,
    ) {
        let (store, arrivals, within) = (cache.clone(), arrivals.clone(), self.within);
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.visible.push(
            async move {
                let (namespace, name) = (namespace.as_str(), name.as_str());
                cache::until_visible(&store, &arrivals, namespace, name, before, after, within)
                    .await
            }
            .boxed(),
        );
    }

    /// Waits until the caches hold what this reconcile wrote, so the reconciles its writes
    /// trigger read them instead of writing them again; returns the versions it read and left.
    async fn until_visible(self) -> VersionSet {
        futures::future::join_all(self.visible).await;
        self.versions
    }

    /// Records what [`apply_child`] did to a child cached in `cache`, and passes on its cached
    /// copy and, if a request was sent, the server's answer.
    fn child<K: Resource<DynamicType = ()>>(
        &mut self,
        cache: &Records,
        namespace: &str,
        (observed, applied): ChildApplied<K>,
    ) -> (Option<Record>, Option<Compact<K>>) {
        let Some((change, applied)) = applied else {
            let version = observed.as_ref().map(|o| o.version.to_string());
            self.versions.set_child(K::kind(&()), version);
            return (observed, None);
        };
        self.versions
            .set_child(K::kind(&()), applied.resource_version());
        self.changes.push(ChildChange {
            child: applied.object_ref(&()),
            change,
        });
        let before = observed.as_ref().map(|o| o.version.to_string());
        self.wrote(
            cache,
            cache.arrivals(),
            (namespace, &applied.name_any()),
            before,
            applied.resource_version(),
        );
        (observed, Some(applied))
    }
}

/// Applies the children whose cached copy is not what the operator applies: the ConfigMap before
/// the Deployment, so a rollout starts from the new configuration, and the Service alongside the
/// ConfigMap (nothing waits for it), which saves a round trip per reconcile. Returns the
/// Deployment as last known; fails with the first child the server refuses (the Deployment is
/// not applied after a refused ConfigMap or Service).
async fn apply_children(
    ctx: &Context,
    namespace: &str,
    children: Children,
    written: &mut Written,
) -> Result<Option<Deployment>, Error> {
    let Children {
        config_map,
        deployment,
        service,
    } = children;
    let (config_map, service) = futures::join!(
        apply_child(ctx, namespace, &ctx.config_maps, config_map),
        apply_service(ctx, namespace, service),
    );
    // Whatever was applied is recorded, even beside a refusal.
    let config_map = config_map.map(|a| written.child(&ctx.config_maps, namespace, a));
    let service = service.map(|a| written.child(&ctx.services, namespace, a));
    config_map.and(service)?;
    let name = deployment.name_any();
    let deployment = apply_child(ctx, namespace, &ctx.deployments, deployment).await?;
    let (observed, applied) = written.child(&ctx.deployments, namespace, deployment);
    let last_known = applied.map(|a| a.record).or(observed);
    Ok(last_known.and_then(|d| d.typed(&name).ok()))
}

/// Applies the Service, first deleting one whose address cannot become the desired one: a
/// cache's Service made with an address (before caches had headless Services) or a headless one
/// whose cluster turned balancer; a Service's `clusterIP` cannot change once set.
async fn apply_service(
    ctx: &Context,
    namespace: &str,
    desired: Service,
) -> Result<ChildApplied<Service>, Error> {
    let name = desired.name_any();
    let observed = ctx.services.get(namespace, &name);
    let headless = build::is_headless(&desired);
    let Some(old) = observed
        .as_ref()
        .filter(|o| applied_headless(o) != headless)
    else {
        return apply_over(ctx, namespace, observed, desired).await;
    };
    tracing::info!(%namespace, %name, headless, "creating the Service again: its address cannot change");
    let api: Api<Service> = Api::namespaced(ctx.shared.client.clone(), namespace);
    apply::delete_at(&api, &name, &old.version)
        .await
        .map_err(Error::apply_child::<Service>(name))?;
    apply_over(ctx, namespace, None, desired).await
}

/// Whether the operator made the cached Service `observed` headless: it owns its `clusterIP`,
/// which it sets only to make a Service headless.
fn applied_headless(observed: &Record) -> bool {
    observed
        .owned
        .as_ref()
        .is_some_and(|owned| owned.covers(&serde_json::json!({"spec": {"clusterIP": "None"}})))
}

/// What [`apply_child`] found and did: the child's cached copy, and the change and the server's
/// answer (what the cache reads of it) if a request was sent.
type ChildApplied<K> = (Option<Record>, Option<(Change, Compact<K>)>);

/// A kind of child: namespaced, applied as JSON, read back.
trait Child:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + Serialize
    + DeserializeOwned
    + Debug
{
}

impl<K> Child for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug
{
}

/// Applies one child if needed.
async fn apply_child<K>(
    ctx: &Context,
    namespace: &str,
    cache: &Records,
    desired: K,
) -> Result<ChildApplied<K>, Error>
where
    K: Child,
{
    let observed = cache.get(namespace, &desired.name_any());
    apply_over(ctx, namespace, observed, desired).await
}

/// Applies one child if needed over `observed`, its cached copy (`None`: there is none).
async fn apply_over<K>(
    ctx: &Context,
    namespace: &str,
    observed: Option<Record>,
    desired: K,
) -> Result<ChildApplied<K>, Error>
where
    K: Child,
{
    let name = desired.name_any();
    let api: Api<Compact<K>> = Api::namespaced(ctx.shared.client.clone(), namespace);
    let applied = apply::apply(&api, desired, observed.as_ref())
        .await
        .map_err(Error::apply_child::<K>(name))?;
    Ok((observed, applied))
}

#[cfg(test)]
mod tests;
