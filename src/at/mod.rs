//! The At controller: run a command once, in a pod, when its schedule is due.
//!
//! Exactly one pod per At, whatever happens (restarts, racing reconciles, a leader change):
//!
//! 1. When the At is due, its status becomes RUNNING with the pod's name *before* the pod is
//!    created: the intent is recorded first.
//! 2. The pod has a deterministic name (`<name>-pod`) and is created by server-side apply, so a
//!    repeated creation is a no-op, and it carries the finalizer [`build::FINALIZER`], so it cannot
//!    disappear without the operator seeing it. "RUNNING and no pod" can then only mean "not
//!    created yet" (create it), and a pod with a deletionTimestamp that had not finished was
//!    deleted (DONE/Failed, reason PodDeleted).
//! 3. When the pod ended, the status becomes DONE, and only then is the finalizer released. A DONE
//!    At is never run again, even when edited.
//!
//! Caches lag behind the operator's own writes (the pod's deletion can arrive before the At's DONE
//! status). So every reconcile that would write anything first re-reads the At from the API
//! server and plans again from that fresh copy: a stale RUNNING can neither create a pod after
//! DONE nor overwrite DONE. A steady state writes nothing and reads nothing. The finalizer is
//! released with a patch that cannot create the pod (an apply would bring a deleted pod back from
//! a stale cache), and, for pods whose At is gone, by a small janitor controller: the At
//! controller cannot reconcile an At that no longer exists.

pub mod build;
pub(crate) mod schedule;
pub mod status;
pub mod uninstall;

use crate::api::At;
use crate::kubernetes::apply;
use crate::kubernetes::arrivals::Arrivals;
use crate::kubernetes::cache::{self, Scope, Watches};
use crate::kubernetes::errors;
use crate::kubernetes::events::Events;
use crate::kubernetes::restricted::RunAs;
use crate::reconcile::{self, Shared};
use crate::runtime::leader::Leadership;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use status::PodAction;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The controller's name in metrics, logs and traces.
pub const CONTROLLER: &str = "at";
/// The janitor's name in metrics, logs and traces: it releases the pods of deleted Ats.
pub const JANITOR: &str = "at-pod";

/// The time, injected so tests control it.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The system's clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// Caches of the At controller and its janitor.
pub struct Context {
    pub shared: Shared,
    pub ats: Store<At>,
    /// The pods of Ats (selected by [`build::selector`]).
    pub pods: Store<Pod>,
    pub clock: Arc<dyn Clock>,
    /// The image of pods whose At names none (`--nginx-image`).
    pub default_image: String,
}

impl reconcile::Context for Context {
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

impl Context {
    fn pod_of(&self, at: &At) -> Option<Arc<Pod>> {
        let namespace = at.namespace().unwrap_or_default();
        self.pods
            .get(&ObjectRef::new(&build::pod_name(&at.name_any())).within(&namespace))
    }
}

/// Builds the At controller, watching Ats and their pods, and the janitor that releases the
/// finalizer of pods whose At is gone. Run both (see `crate::run`), with [`reconcile`] and
/// [`release_orphan`], on the same context.
pub fn controller(
    client: Client,
    scope: &Scope,
    events: Events,
    leadership: Leadership,
    concurrency: u16,
    run_as: RunAs,
    default_image: String,
) -> (Arc<Context>, Controller<At>, Controller<Pod>) {
    let watches = Watches::default();
    // No reconcile of this controller waits for its writes to reach the caches.
    let arrivals = Arrivals::default();
    let (ats, at_events) = watches.cached(
        scope.api::<At>(client.clone()),
        watcher::Config::default(),
        &arrivals,
        |_| (),
    );
    let (pods, pod_events) = watches.cached(
        scope.api::<Pod>(client.clone()),
        watcher::Config::default().labels(&build::selector()),
        &arrivals,
        |_| (),
    );

    // The janitor looks at a pod when it is being deleted, and when its At is deleted: whichever
    // of the two caches learns last, the janitor then sees both. So it is told after the caches
    // took the event (inspected after them, not observed before).
    let (orphans_tx, orphans_rx) = mpsc::unbounded_channel::<ObjectRef<Pod>>();
    let tx = orphans_tx.clone();
    let at_stream = at_events.inspect(move |event| {
        if let Ok(watcher::Event::Delete(at)) = event {
            let namespace = at.namespace().unwrap_or_default();
            let _ = tx.send(ObjectRef::new(&build::pod_name(&at.name_any())).within(&namespace));
        }
    });
    let pod_stream = pod_events.inspect(move |event| {
        if let Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event {
            if pod.metadata.deletion_timestamp.is_some() && build::held(pod) {
                let _ = orphans_tx.send(ObjectRef::from_obj(pod));
            }
        }
    });

    let config = Config::default().concurrency(concurrency);
    let ats_controller = Controller::for_stream(at_stream.applied_objects(), ats.clone())
        .watches_stream(pod_stream.touched_objects(), owners)
        .reconcile_all_on(leadership.acquired())
        .reconcile_all_on(watches.relists.listed_again())
        .with_config(config.clone());
    let janitor = Controller::for_stream(
        futures::stream::empty::<Result<Pod, watcher::Error>>(),
        pods.clone(),
    )
    .reconcile_on(UnboundedReceiverStream::new(orphans_rx))
    .reconcile_all_on(leadership.acquired())
    .reconcile_all_on(watches.relists.listed_again())
    .with_config(config);

    let ready = watches.ready;
    let context = Arc::new(Context {
        shared: Shared {
            run_as,
            ..Shared::new(client, events, ready)
        },
        ats,
        pods,
        clock: Arc::new(SystemClock),
        default_image,
    });
    (context, ats_controller, janitor)
}

/// Nothing reads an At's labels.
impl cache::Cached for At {
    const LABELS_READ: bool = false;
}

/// A pod is told from others, and matched to its At, by its labels.
impl cache::Cached for Pod {
    const LABELS_READ: bool = true;
}

/// The At a pod belongs to: by its instance label, and by its controller owner (they differ only
/// if someone edited the pod; both are then reconciled).
pub fn owners(pod: Pod) -> Vec<ObjectRef<At>> {
    let Some(namespace) = pod.namespace() else {
        return Vec::new();
    };
    let by_label = pod.labels().get(build::INSTANCE_LABEL).cloned();
    let by_owner = pod
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "At")
        .map(|r| r.name.clone());
    let mut names: Vec<String> = by_label.into_iter().chain(by_owner).collect();
    names.dedup();
    names
        .iter()
        .map(|name| ObjectRef::new(name).within(&namespace))
        .collect()
}

/// Errors of an At's reconcile, by step. Each retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Plan: the At could not be read afresh before a write.
    #[error("could not read the At afresh before writing: {}", errors::describe(.0))]
    ReadFresh(#[source] kube::Error),
    /// Status: the API server refused the status.
    #[error("could not write the status: {}", errors::describe(.0))]
    WriteStatus(#[source] kube::Error),
    /// Pod: the API server refused the pod.
    #[error("could not create Pod {pod}: {}", errors::describe(source))]
    CreatePod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    /// Pod: its finalizer could not be released.
    #[error(
        "could not release the finalizer of Pod {pod}: {}",
        errors::describe(source)
    )]
    ReleaseFinalizer {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

impl reconcile::Failure for Error {
    fn request(&self) -> &kube::Error {
        match self {
            Error::ReadFresh(source) | Error::WriteStatus(source) => source,
            Error::CreatePod { source, .. } | Error::ReleaseFinalizer { source, .. } => source,
        }
    }
}

/// Reconciles one At: plan from the caches; if the plan writes anything, plan again from a fresh
/// read of the At; write the status, publish the Events, then act on the pod.
pub async fn reconcile(at: Arc<At>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.shared.ready.wait().await;
    let namespace = at.namespace().unwrap_or_default();
    let name = at.name_any();
    let now = ctx.clock.now();
    let client = &ctx.shared.client;
    let api: Api<At> = Api::namespaced(client.clone(), &namespace);

    let mut at = at;
    let mut pod = ctx.pod_of(&at);
    let mut plan = status::plan(&at, status::view(&at, pod.as_deref()), now);
    if plan.writes(&at) {
        // Never write from a cache that may lag behind our own last writes.
        let Some(fresh) = api.get_opt(&name).await.map_err(Error::ReadFresh)? else {
            return Ok(Action::await_change());
        };
        at = Arc::new(fresh);
        pod = ctx.pod_of(&at);
        plan = status::plan(&at, status::view(&at, pod.as_deref()), now);
    }

    match apply::apply_status(&api, at.as_ref(), at.status.as_ref(), &plan.status).await {
        Ok(_) => {}
        Err(error) if errors::is_not_found(&error) => {
            tracing::debug!(%namespace, %name, "deleted before its status was written");
            return Ok(Action::await_change());
        }
        Err(error) => return Err(Error::WriteStatus(error)),
    }
    // The Events tell the status transition just written: published before the pod action, so a
    // failed (and retried) pod write does not lose them.
    for notice in plan.notices {
        ctx.shared.events.publish(at.as_ref(), notice).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    match (plan.pod, pod) {
        (PodAction::Create, _) => {
            tracing::info!(%namespace, %name, "creating the pod");
            let pod = build::pod(&at, &ctx.shared.run_as, &ctx.default_image);
            let pod_name = pod.name_any();
            apply::apply_always(&pods, pod)
                .await
                .map_err(|source| Error::CreatePod {
                    pod: pod_name,
                    source,
                })?;
        }
        (PodAction::Release, Some(pod)) => release(&pods, &pod).await?,
        _ => {}
    }
    ctx.shared.succeeded(at.as_ref());
    Ok(plan.wake.map_or_else(Action::await_change, Action::requeue))
}

/// The janitor: releases the finalizer of a pod being deleted whose At is gone (or is another At
/// of the same name). While the At exists, its own reconcile decides.
pub async fn release_orphan(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.shared.ready.wait().await;
    if pod.metadata.deletion_timestamp.is_none() || !build::held(&pod) {
        return Ok(Action::await_change());
    }
    let namespace = pod.namespace().unwrap_or_default();
    let owned = pod
        .owner_references()
        .iter()
        .filter(|r| r.controller == Some(true) && r.kind == "At")
        .any(|r| {
            ctx.ats
                .get(&ObjectRef::new(&r.name).within(&namespace))
                .is_some_and(|at| at.uid().as_deref() == Some(r.uid.as_str()))
        });
    if owned {
        return Ok(Action::await_change());
    }
    tracing::info!(%namespace, pod = %pod.name_any(), "releasing the pod of a deleted At");
    let api: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    release(&api, &pod).await?;
    ctx.shared.succeeded(pod.as_ref());
    Ok(Action::await_change())
}

/// Removes the operator's finalizer from `pod`.
async fn release(api: &Api<Pod>, pod: &Pod) -> Result<(), Error> {
    apply::remove_finalizer(api, pod, build::FINALIZER)
        .await
        .map(|_| ())
        .map_err(|source| Error::ReleaseFinalizer {
            pod: pod.name_any(),
            source,
        })
}
