//! Wraps a kube-runtime reconcile function: a root span per reconcile (controller, namespace,
//! name, result, trace_id), and the controller-runtime metrics (time, result, active workers).

use super::metrics::{ControllerMetrics, Outcome};
use super::telemetry;
use crate::leader::Leadership;
use futures::future::BoxFuture;
use futures::FutureExt;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument as _;

/// The metrics label of a reconcile result. kube has no immediate requeue: a requeue is always
/// after a delay.
pub fn outcome<E>(result: &Result<Action, E>) -> Outcome {
    match result {
        Err(_) => Outcome::Error,
        Ok(action) if *action == Action::await_change() => Outcome::Success,
        Ok(_) => Outcome::RequeueAfter,
    }
}

/// Instruments the reconciles of one controller.
#[derive(Clone)]
pub struct Reconciles {
    metrics: ControllerMetrics,
    leadership: Leadership,
}

impl Reconciles {
    pub fn new(metrics: ControllerMetrics, leadership: Leadership) -> Self {
        Reconciles {
            metrics,
            leadership,
        }
    }

    /// Runs `reconcile(obj, ctx)` inside a new root span, timing it and counting its result.
    /// Meant for `Controller::run(|o, c| reconciles.run(o, c, reconcile), ...)`. On a standby
    /// the reconcile is not called at all (nor counted, nor traced): it would do nothing, and
    /// dashboards must show the work of the leader only. Acquiring leadership reconciles all.
    pub fn run<K, C, E, F, Fut>(
        &self,
        obj: Arc<K>,
        ctx: Arc<C>,
        reconcile: F,
    ) -> BoxFuture<'static, Result<Action, E>>
    where
        K: Resource,
        F: FnOnce(Arc<K>, Arc<C>) -> Fut,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        if !self.leadership.is_leader() {
            return futures::future::ready(Ok(Action::await_change())).boxed();
        }
        let metrics = self.metrics.clone();
        let span = tracing::info_span!(
            parent: None,
            "reconcile",
            controller = metrics.name(),
            namespace = obj.namespace().unwrap_or_default(),
            name = obj.name_any(),
            result = tracing::field::Empty,
            trace_id = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        span.record("trace_id", telemetry::trace_id(&span));
        let future = reconcile(obj, ctx);
        let inner = span.clone();
        async move {
            let worker = metrics.worker();
            let start = Instant::now();
            let result = future.await;
            // Free the worker before counting: a scrape that sees the reconcile counted must
            // not still see it active.
            drop(worker);
            let outcome = outcome(&result);
            metrics.observe(outcome, start.elapsed().as_secs_f64());
            inner.record("result", outcome.as_str());
            if let Err(error) = &result {
                inner.record("otel.status_code", "ERROR");
                tracing::debug!(%error, "reconcile failed");
            }
            result
        }
        .instrument(span)
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::time::Duration;

    fn object() -> Arc<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("a".into());
        cm.metadata.namespace = Some("ns".into());
        Arc::new(cm)
    }

    #[test]
    fn results_map_to_controller_runtime_labels() {
        assert_eq!(outcome::<()>(&Ok(Action::await_change())), Outcome::Success);
        assert_eq!(
            outcome::<()>(&Ok(Action::requeue(Duration::from_secs(3)))),
            Outcome::RequeueAfter
        );
        assert_eq!(outcome::<()>(&Err(())), Outcome::Error);
    }

    #[tokio::test]
    async fn a_reconcile_is_timed_counted_and_its_worker_released() {
        let metrics = Metrics::new();
        let reconciles = Reconciles::new(metrics.controller("things", 4), Leadership::always());
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(reconciles.run(object(), Arc::new(()), |_, _| async move {
            entered_tx.send(()).unwrap();
            release_rx.await.unwrap();
            Err::<Action, String>("boom".into())
        }));
        entered_rx.await.unwrap();
        assert!(metrics
            .encode()
            .contains("controller_runtime_active_workers{controller=\"things\"} 1\n"));
        release_tx.send(()).unwrap();
        assert_eq!(running.await.unwrap(), Err("boom".to_string()));
        reconciles
            .run(object(), Arc::new(()), |_, _| async {
                Ok::<_, String>(Action::await_change())
            })
            .await
            .unwrap();
        let text = metrics.encode();
        for line in [
            "controller_runtime_active_workers{controller=\"things\"} 0",
            "controller_runtime_reconcile_total{controller=\"things\",result=\"error\"} 1",
            "controller_runtime_reconcile_total{controller=\"things\",result=\"success\"} 1",
            "controller_runtime_reconcile_errors_total{controller=\"things\"} 1",
            "controller_runtime_reconcile_time_seconds_count{controller=\"things\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
    }

    #[tokio::test]
    async fn a_cancelled_reconcile_frees_its_worker() {
        let metrics = Metrics::new();
        let reconciles = Reconciles::new(metrics.controller("things", 1), Leadership::always());
        let running = tokio::spawn(reconciles.run(object(), Arc::new(()), |_, _| {
            futures::future::pending::<Result<Action, String>>()
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(metrics
            .encode()
            .contains("controller_runtime_active_workers{controller=\"things\"} 1\n"));
        running.abort();
        let _ = running.await;
        assert!(metrics
            .encode()
            .contains("controller_runtime_active_workers{controller=\"things\"} 0\n"));
    }
}

#[cfg(test)]
mod standby_tests {
    use super::*;
    use crate::metrics::Metrics;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[tokio::test]
    async fn a_standby_neither_calls_nor_counts_the_reconcile() {
        let metrics = Metrics::new();
        let leadership = Leadership::standby();
        let reconciles = Reconciles::new(metrics.controller("things", 1), leadership.clone());
        let called = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let run = |reconciles: &Reconciles| {
            let called = called.clone();
            reconciles.run(
                Arc::new(ConfigMap::default()),
                Arc::new(()),
                move |_, _| async move {
                    called.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, String>(Action::await_change())
                },
            )
        };
        assert_eq!(run(&reconciles).await, Ok(Action::await_change()));
        assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(metrics.encode().contains(
            "controller_runtime_reconcile_time_seconds_count{controller=\"things\"} 0\n"
        ));
        leadership.set(true);
        run(&reconciles).await.unwrap();
        assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(metrics.encode().contains(
            "controller_runtime_reconcile_total{controller=\"things\",result=\"success\"} 1\n"
        ));
    }
}
