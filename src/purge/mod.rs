//! The CdnPurge controller: validate the purge → find the caches it reaches → have their pods
//! apply it (signed batches to their sidecars, [`dispatch`]) → write the status once it is
//! complete (or when a pod keeps it waiting) → publish the Events.
//!
//! A purge is applied once: its job lives in this process until its final status is cached; a
//! new leader starts the purges that were not over, whose pods apply them again with the cutoff
//! of their first time (what was fetched since stays cached). A purge that is over costs the
//! cache its name and phase only: its spec and status are dropped ([`PurgeSummary`]).

pub mod dispatch;
pub mod pods;
pub mod signing;
pub mod status;
pub mod targets;

use crate::api::{CdnCluster, CdnPurge, CdnPurgeSpec, CdnPurgeStatus, PurgePhase};
use crate::kubernetes::apply;
use crate::kubernetes::arrivals::Arrivals;
use crate::kubernetes::cache::{self, CachesReady, Scope, Watches};
use crate::kubernetes::errors;
use crate::kubernetes::events::Events;
use crate::nginx_cache::selector::Selection;
use crate::nginx_cache::wire;
use crate::reconcile::{self, Shared};
use crate::runtime::leader::Leadership;
use dispatch::{Dispatcher, Job, JobKey};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use pods::PodTargets;
use serde::{Deserialize, Deserializer};
use signing::Signer;
use status::Observed;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The controller's name in metrics, logs and traces.
pub const CONTROLLER: &str = "cdnpurge";
/// How long a purge runs before its status says it is under way: one that completes sooner is
/// written once, Complete (a burst of purges costs a write each, not two).
pub const REPORT_AFTER: Duration = Duration::from_secs(2);

/// A CdnPurge as the cache keeps it: its metadata and phase, and its spec and status only while
/// it is not over.
#[derive(Clone, Debug)]
pub struct PurgeSummary {
    pub metadata: ObjectMeta,
    pub phase: Option<PurgePhase>,
    pub open: Option<Arc<Open>>,
}

/// What a purge that is not over carries.
#[derive(Debug)]
pub struct Open {
    pub spec: CdnPurgeSpec,
    pub status: Option<CdnPurgeStatus>,
}

impl PurgeSummary {
    /// The summary of `purge`.
    pub fn of(purge: CdnPurge) -> Self {
        let phase = purge.status.as_ref().and_then(|s| s.phase);
        let open = (!phase.is_some_and(PurgePhase::is_final)).then(|| {
            Arc::new(Open {
                spec: purge.spec,
                status: purge.status,
            })
        });
        let m = purge.metadata;
        PurgeSummary {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                generation: m.generation,
                creation_timestamp: m.creation_timestamp,
                ..ObjectMeta::default()
            },
            phase,
            open,
        }
    }
}

impl<'de> Deserialize<'de> for PurgeSummary {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        CdnPurge::deserialize(deserializer).map(PurgeSummary::of)
    }
}

impl Resource for PurgeSummary {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        CdnPurge::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        CdnPurge::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        CdnPurge::version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        CdnPurge::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl cache::Cached for PurgeSummary {
    const LABELS_READ: bool = false;
}

/// Caches of the CdnPurge controller.
pub struct Context {
    pub shared: Shared,
    pub purges: Store<PurgeSummary>,
    pub arrivals: Arrivals,
    /// The CdnClusters, as the CdnCluster controller caches them, and when its caches (these and
    /// their pods, [`PodTargets`]) have listed.
    pub clusters: Store<CdnCluster>,
    pub clusters_ready: CachesReady,
    /// The jobs; or why the operator cannot sign purges (every purge then fails, saying so).
    pub dispatcher: Result<Dispatcher, String>,
}

impl reconcile::Context for Context {
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

/// Builds the controller: CdnPurges watched, a reconcile when one is created, and when its job's
/// progress calls for a status.
#[allow(clippy::too_many_arguments)]
pub fn controller(
    client: Client,
    scope: &Scope,
    events: Events,
    leadership: Leadership,
    concurrency: u16,
    clusters: Store<CdnCluster>,
    clusters_ready: CachesReady,
    pods: PodTargets,
    signer: Result<Arc<Signer>, String>,
) -> (Arc<Context>, Controller<PurgeSummary>) {
    let watches = Watches::default();
    let arrivals = Arrivals::default();
    let (purges, purge_events) = watches.cached(
        scope.api::<PurgeSummary>(client.clone()),
        watcher::Config::default(),
        &arrivals,
        |_| (),
    );
    let (progress_tx, progress_rx) = mpsc::unbounded_channel();
    let notify: dispatch::Notify = Arc::new(move |key: &JobKey| {
        let _ = progress_tx.send(ObjectRef::<PurgeSummary>::new(&key.name).within(&key.namespace));
    });
    let kept = kept_volumes(clusters.clone());
    let dispatcher = signer.map(|signer| Dispatcher::new(signer, pods, kept, notify));
    let starter = dispatcher.clone().ok().map(|dispatcher| Starter {
        dispatcher,
        clusters: clusters.clone(),
        clusters_ready: clusters_ready.clone(),
        leadership: leadership.clone(),
    });
    let purge_events = purge_events.inspect(move |event| match (event, &starter) {
        (Ok(watcher::Event::Apply(purge) | watcher::Event::InitApply(purge)), Some(starter)) => {
            starter.start(purge)
        }
        // A purge deleted before its end: its job is forgotten once over (no reconcile comes
        // for it).
        (Ok(watcher::Event::Delete(purge)), Some(starter)) => {
            let uid = purge.uid().unwrap_or_default();
            starter.dispatcher.forget_unless(|key| key.uid != uid);
        }
        _ => {}
    });
    let controller = Controller::for_stream(purge_events.applied_objects(), purges.clone())
        .reconcile_on(UnboundedReceiverStream::new(progress_rx))
        .reconcile_all_on(leadership.acquired())
        .reconcile_all_on(watches.relists.listed_again())
        .with_config(Config::default().concurrency(concurrency));
    let context = Arc::new(Context {
        shared: Shared::new(client, events, watches.ready),
        purges,
        arrivals,
        clusters,
        clusters_ready,
        dispatcher,
    });
    (context, controller)
}

/// Starts a purge's job as soon as the watch brings it, not when its reconcile comes: in a
/// burst, the reconciles queue behind the status writes of the purges before (each a request to
/// the API server), and the viewers would wait for them. The reconcile then finds the job under
/// way; it starts the job itself when this could not (the caches not listed yet, a new leader).
struct Starter {
    dispatcher: Dispatcher,
    clusters: Store<CdnCluster>,
    clusters_ready: CachesReady,
    leadership: Leadership,
}

impl Starter {
    fn start(&self, purge: &PurgeSummary) {
        let Some(open) = &purge.open else {
            return;
        };
        if !self.leadership.is_leader() || !self.clusters_ready.is_ready() {
            return;
        }
        let key = job_key(purge);
        if self.dispatcher.progress(&key).is_none() {
            // Refused here, the reconcile says why in the status.
            let _ = plan(&self.dispatcher, &self.clusters, &key, &open.spec);
        }
    }
}

/// The job of `purge`.
fn job_key(purge: &PurgeSummary) -> JobKey {
    JobKey {
        namespace: purge.namespace().unwrap_or_default(),
        name: purge.name_any(),
        uid: purge.uid().unwrap_or_default(),
    }
}

/// Errors of a CdnPurge's reconcile, by step. Each retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Status: the API server refused the status.
    #[error("could not write the status: {}", errors::describe(.0))]
    WriteStatus(#[source] kube::Error),
}

impl reconcile::Failure for Error {
    fn request(&self) -> &kube::Error {
        match self {
            Error::WriteStatus(source) => source,
        }
    }
}

/// The purge of `spec`, as batches carry it (without its id, set by pass).
pub fn wire_purge(spec: &CdnPurgeSpec) -> wire::Purge {
    wire::Purge {
        id: String::new(),
        mode: spec.mode().into(),
        host: spec.host.clone(),
        paths: spec.paths.clone().unwrap_or_default(),
        prefixes: spec.prefixes.clone().unwrap_or_default(),
        regexes: spec.regexes.clone().unwrap_or_default(),
        surrogate_keys: spec.surrogate_keys.clone().unwrap_or_default(),
        all: spec.all.unwrap_or(false),
    }
}

/// Whether a pod's volume is still its cluster's, as the CdnClusters' cache holds them
/// ([`dispatch::Kept`]): the cluster has a volume and a replica of the pod's ordinal.
pub fn kept_volumes(clusters: Store<CdnCluster>) -> dispatch::Kept {
    Arc::new(move |namespace: &str, cluster: &str, pod: &str| {
        let Some(cluster) = clusters.get(&ObjectRef::new(cluster).within(namespace)) else {
            return false;
        };
        let name = cluster.metadata.name.as_deref().unwrap_or_default();
        let ordinal = pod
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse::<i32>().ok());
        crate::cdncluster::build::persistent_volume(&cluster).is_some()
            && ordinal.is_some_and(|n| n < cluster.spec.replicas)
    })
}

/// Reconciles one CdnPurge: validate → targets → apply (the job) → status → Events.
pub async fn reconcile(purge: Arc<PurgeSummary>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.shared.ready.wait().await;
    ctx.clusters_ready.wait().await;
    let key = job_key(&purge);
    let Some(open) = purge.open.clone() else {
        // Over, as cached: its job is done with.
        if let Ok(dispatcher) = &ctx.dispatcher {
            dispatcher.forget(&key);
        }
        return Ok(Action::await_change());
    };
    let started;
    let tiers;
    let progress;
    let mut written = None;
    let planned = match &ctx.dispatcher {
        Ok(dispatcher) => plan(dispatcher, &ctx.clusters, &key, &open.spec),
        Err(why) => Err((
            status::NO_SIGNING_KEY,
            format!("the operator cannot sign purges: {why}"),
        )),
    };
    let observed = match planned {
        Err((reason, message)) => {
            started = Timestamp::now();
            Observed::Failed { reason, message }
        }
        Ok((clusters, job)) => {
            tiers = clusters;
            progress = job;
            started = progress.started;
            written = progress.status_written.map(|at| at.elapsed());
            Observed::Applying {
                clusters: &tiers,
                progress: &progress,
            }
        }
    };
    let status = status::desired(
        open.status.as_ref(),
        purge.metadata.generation,
        &observed,
        Timestamp::now(),
    );
    let over = status.phase.is_some_and(PurgePhase::is_final);
    let report = if over {
        status::Report::Now
    } else {
        let running = Timestamp::now().duration_since(started).unsigned_abs();
        status::report(open.status.as_ref(), &status, running, written)
    };
    if report == status::Report::Now {
        let notices = status::notices(open.status.as_ref(), &status);
        write_status(&ctx, &purge, open.status.as_ref(), &status).await?;
        if let Ok(dispatcher) = &ctx.dispatcher {
            dispatcher.status_written(&key);
        }
        for notice in notices {
            ctx.shared.events.publish(purge.as_ref(), notice).await;
        }
    }
    ctx.shared.succeeded(purge.as_ref());
    Ok(match report {
        _ if over => Action::await_change(),
        status::Report::After(wait) => Action::requeue(wait),
        status::Report::Now => Action::requeue(status::COUNTS_EVERY_MIN),
    })
}

/// The clusters `spec` reaches and its job's progress, its job started if it was not; or why it
/// cannot be applied (a reason of [`status`] and a message).
fn plan(
    dispatcher: &Dispatcher,
    clusters: &Store<CdnCluster>,
    key: &JobKey,
    spec: &CdnPurgeSpec,
) -> Result<(Vec<String>, dispatch::Progress), (&'static str, String)> {
    let purge = wire_purge(spec);
    Selection::new(&purge).map_err(|e| (status::INVALID, e.to_string()))?;
    let lookup = |name: &str| clusters.get(&ObjectRef::new(name).within(&key.namespace));
    let tiers = targets::tiers(&spec.cdn_cluster, lookup)
        .map_err(|e| (status::CLUSTER_NOT_FOUND, e.to_string()))?;
    let clusters: Vec<String> = tiers.iter().map(|t| t.name.clone()).collect();
    if dispatcher.progress(key).is_none() {
        tracing::info!(purge = %key, clusters = ?clusters, "purging {}", crate::nginx_cache::selector::describe(&purge));
        dispatcher.start(Job {
            key: key.clone(),
            purge,
            tiers,
        });
    }
    let progress = dispatcher
        .progress(key)
        .expect("a job just started is known");
    Ok((clusters, progress))
}

/// Applies `status` unless the cache holds it, then waits (a little) for the cache to hold it:
/// a reconcile that comes before would write it again.
async fn write_status(
    ctx: &Context,
    purge: &PurgeSummary,
    current: Option<&CdnPurgeStatus>,
    status: &CdnPurgeStatus,
) -> Result<(), Error> {
    let (namespace, name) = (purge.namespace().unwrap_or_default(), purge.name_any());
    let api: Api<PurgeSummary> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    match apply::apply_status(&api, purge, current, status).await {
        Ok(Some(written)) => {
            cache::until_visible(
                &ctx.purges,
                &ctx.arrivals,
                &namespace,
                &name,
                purge.resource_version(),
                written.resource_version(),
                cache::WRITES_VISIBLE_WITHIN,
            )
            .await;
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(error) if errors::is_not_found(&error) => Ok(()),
        Err(error) => Err(Error::WriteStatus(error)),
    }
}
