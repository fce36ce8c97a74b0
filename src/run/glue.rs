//! What wires each controller to the runtime: metrics, probes, leadership, shutdown.

use crate::reconcile::{self, Context};
use crate::runtime::http::Health;
use crate::runtime::instrument::Reconciles;
use crate::runtime::leader::Leadership;
use crate::runtime::metrics::Metrics;
use crate::runtime::shutdown::Shutdown;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{self as kube_controller, Action, Controller};
use kube::Resource;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

/// What every controller is wired to: metrics, probes, the shutdown signal.
pub(super) struct Glue {
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Health,
    pub(super) shutdown: Shutdown,
    pub(super) leadership: Leadership,
    pub(super) concurrency: u16,
}

impl Glue {
    /// Wires one controller: readiness once its caches have listed, liveness while its loop
    /// runs, each reconcile instrumented, the shared error policy, graceful shutdown on the
    /// signal. Returns the loop, to be polled until the controller stops.
    pub(super) fn controller<K, Ctx, Fut, E>(
        &self,
        name: &'static str,
        controller: Controller<K>,
        reconcile: fn(Arc<K>, Arc<Ctx>) -> Fut,
        ctx: Arc<Ctx>,
    ) -> BoxFuture<'static, ()>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        Ctx: Context,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: reconcile::Failure,
    {
        let ready = ctx.shared().ready.clone();
        self.health
            .ready_when(name, async move { ready.wait().await });
        let alive = self.health.alive_while(name);
        let reconciles = Reconciles::new(
            self.metrics.controller(name, self.concurrency),
            self.leadership.clone(),
        );
        let stream = controller
            .graceful_shutdown_on(self.shutdown.clone().cancelled_owned())
            .run(
                move |obj, ctx| reconciles.run(obj, ctx, reconcile),
                reconcile::error_policy,
                ctx,
            );
        async move {
            let _alive = alive;
            stream
                .for_each(|result| async move {
                    match result {
                        // error_policy has logged it.
                        Ok(_) | Err(kube_controller::Error::ReconcilerFailed(..)) => {}
                        // A trigger for an object deleted meanwhile: every deletion makes some.
                        Err(error @ kube_controller::Error::ObjectNotFound(_)) => {
                            tracing::debug!(controller = name, %error, "nothing to reconcile")
                        }
                        Err(error) => tracing::warn!(controller = name, %error, "controller error"),
                    }
                })
                .await;
        }
        .boxed()
    }
}
