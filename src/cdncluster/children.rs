//! Apply: the children whose cached copy is not what the operator applies, through the one write
//! path ([`crate::kubernetes::apply`]).

use super::build::{self, Children, Workload};
use super::written::{ChildApplied, Written};
use super::{Context, Error};
use crate::kubernetes::apply;
use crate::kubernetes::compact::Compact;
use crate::kubernetes::record::Record;
use crate::kubernetes::records::Records;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Applies the children whose cached copy is not what the operator applies: the ConfigMap before
/// the workload, so a rollout starts from the new configuration, and the Service alongside the
/// ConfigMap (nothing waits for it), which saves a round trip per reconcile. Returns the
/// workload as last known, its counts read as a Deployment's (a StatefulSet's status has the
/// same); fails with the first child the server refuses (the workload is not applied after a
/// refused ConfigMap or Service).
pub(super) async fn apply(
    ctx: &Context,
    namespace: &str,
    children: Children,
    written: &mut Written,
) -> Result<Option<Deployment>, Error> {
    let Children {
        config_map,
        workload,
        service,
        pod_disruption_budget,
        ingress,
    } = children;
    let cluster = service.name_any();
    let (budget_name, ingress_name) = (
        build::pod_disruption_budget_name(&cluster),
        build::ingress_name(&cluster),
    );
    let (budgets, ingresses) = (&ctx.pod_disruption_budgets, &ctx.ingresses);
    let (config_map, service, budget, ingress) = futures::join!(
        apply_child(ctx, namespace, &ctx.config_maps, config_map),
        apply_service(ctx, namespace, service),
        apply_optional(ctx, namespace, budgets, &budget_name, pod_disruption_budget),
        apply_optional(ctx, namespace, ingresses, &ingress_name, ingress),
    );
    // Whatever was applied is recorded, even beside a refusal.
    let config_map = config_map.map(|a| written.child(&ctx.config_maps, namespace, a));
    let service = service.map(|a| written.child(&ctx.services, namespace, a));
    let budget = budget.map(|b| b.record(written, budgets, (namespace, &budget_name)));
    let ingress = ingress.map(|i| i.record(written, ingresses, (namespace, &ingress_name)));
    config_map.and(service).and(budget).and(ingress)?;
    let replicas = workload.replicas();
    // The StatefulSets' cache, listed: needed for a StatefulSet, and for a Deployment only if a
    // StatefulSet of the operator's may exist (its watch was started: a pod of one was seen).
    if matches!(workload, Workload::StatefulSet(_)) || ctx.stateful_set_watch.is_wanted() {
        ctx.stateful_set_watch.listed().await;
    }
    match workload {
        Workload::Deployment(desired) => {
            let replaced = build::stateful_set_name(&cluster);
            let replaced = (&ctx.stateful_sets, replaced.as_str());
            let applied = (&ctx.deployments, desired, replicas);
            apply_workload::<_, StatefulSet>(ctx, namespace, applied, replaced, written).await
        }
        Workload::StatefulSet(desired) => {
            let replaced = build::deployment_name(&cluster);
            let replaced = (&ctx.deployments, replaced.as_str());
            let applied = (&ctx.stateful_sets, desired, replicas);
            apply_workload::<_, Deployment>(ctx, namespace, applied, replaced, written).await
        }
    }
}

/// Applies the workload `desired` (cached in `cache`, asking for `replicas`) and, once its pods
/// are all ready, deletes the workload `Old` named `old` (cached in `old_cache`) that the
/// cluster ran before its cache's volume was set or removed: the cluster never serves with
/// fewer pods. Returns the workload as last known, read as a Deployment.
async fn apply_workload<K: Child, Old: Child>(
    ctx: &Context,
    namespace: &str,
    (cache, desired, replicas): (&Records, K, i32),
    (old_cache, old): (&Records, &str),
    written: &mut Written,
) -> Result<Option<Deployment>, Error> {
    let name = desired.name_any();
    let applied = apply_child(ctx, namespace, cache, desired).await?;
    let (observed, applied) = written.child(cache, namespace, applied);
    let last_known = applied.map(|a| a.record).or(observed);
    let last_known: Option<Deployment> = last_known.and_then(|w| w.typed(&name).ok());
    if let Some(before) = old_cache.get(namespace, old) {
        if super::status::rolled_out(last_known.as_ref(), replicas) {
            delete_child::<Old>(ctx, namespace, old, &before).await?;
            tracing::info!(%namespace, name = %old, kind = %Old::kind(&()), "deleted: the cluster's pods run in a {} now", K::kind(&()));
            written.deleted(old_cache, (namespace, old), &before);
        }
    }
    Ok(last_known)
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
    delete_child::<Service>(ctx, namespace, &name, old).await?;
    apply_over(ctx, namespace, None, desired).await
}

/// Deletes the child `K` named `name` if it is still at its cached version `old` (the one delete
/// path of the children).
async fn delete_child<K: Child>(
    ctx: &Context,
    namespace: &str,
    name: &str,
    old: &Record,
) -> Result<(), Error> {
    let api: Api<K> = Api::namespaced(ctx.shared.client.clone(), namespace);
    apply::delete_at(&api, name, &old.version)
        .await
        .map_err(Error::apply_child::<K>(name.to_string()))?;
    Ok(())
}

/// What became of a child a cluster has only in some cases (a PodDisruptionBudget, an Ingress).
enum Optional<K> {
    Applied(Box<ChildApplied<K>>),
    /// Deleted at this cached version: the spec no longer asks for it.
    Deleted(Record),
    /// None wanted, none there.
    None,
}

impl<K: Resource<DynamicType = ()>> Optional<K> {
    /// Records what was done in `written`.
    fn record(self, written: &mut Written, cache: &Records, (namespace, name): (&str, &str)) {
        match self {
            Optional::Applied(applied) => drop(written.child(cache, namespace, *applied)),
            Optional::Deleted(before) => written.deleted(cache, (namespace, name), &before),
            Optional::None => {}
        }
    }
}

/// Applies `desired`, or, when none is wanted, deletes the cluster's own `name` (at its cached
/// version) if there is one.
async fn apply_optional<K: Child>(
    ctx: &Context,
    namespace: &str,
    cache: &Records,
    name: &str,
    desired: Option<K>,
) -> Result<Optional<K>, Error> {
    if let Some(desired) = desired {
        let applied = apply_child(ctx, namespace, cache, desired).await?;
        return Ok(Optional::Applied(Box::new(applied)));
    }
    let Some(old) = cache.get(namespace, name) else {
        return Ok(Optional::None);
    };
    delete_child::<K>(ctx, namespace, name, &old).await?;
    tracing::info!(%namespace, %name, kind = %K::kind(&()), "deleted: the spec no longer asks for it");
    Ok(Optional::Deleted(old))
}

/// Whether the operator made the cached Service `observed` headless: it owns its `clusterIP`,
/// which it sets only to make a Service headless.
fn applied_headless(observed: &Record) -> bool {
    observed
        .owned
        .as_ref()
        .is_some_and(|owned| owned.covers(&serde_json::json!({"spec": {"clusterIP": "None"}})))
}

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
