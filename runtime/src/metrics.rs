//! Prometheus metrics in the OpenMetrics text format, under controller-runtime's names so the
//! dashboards and alerts written for Go operators work unchanged. Domain-free: controllers are
//! known by name, and domain gauges are registered as label → value functions read at scrape time.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::sync::{Arc, RwLock};

/// The content type of the OpenMetrics exposition (what Prometheus asks for first).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the classic Prometheus text format, for clients that do not ask for
/// OpenMetrics (curl, promtool, older scrapers).
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// controller-runtime's buckets for `controller_runtime_reconcile_time_seconds`.
const RECONCILE_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabels {
    name: String,
}

/// How a reconcile ended, as controller-runtime labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Error,
    /// Requeued at once (controller-runtime's `Requeue: true`).
    Requeue,
    /// Requeued after a delay.
    RequeueAfter,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Success,
        Outcome::Error,
        Outcome::Requeue,
        Outcome::RequeueAfter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Error => "error",
            Outcome::Requeue => "requeue",
            Outcome::RequeueAfter => "requeue_after",
        }
    }
}

/// Every metric of the process. Cheap to share behind an `Arc`.
pub struct Metrics {
    registry: RwLock<Registry>,
    reconcile_total: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_time: Family<ControllerLabels, Histogram>,
    max_concurrent: Family<ControllerLabels, Gauge>,
    active_workers: Family<ControllerLabels, Gauge>,
    leader_status: Family<NameLabels, Gauge>,
    rest_client_requests: crate::client_metrics::Requests,
}

impl Metrics {
    /// The runtime metrics, and the process metrics read from /proc at each scrape.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let reconcile_total = Family::<ResultLabels, Counter>::default();
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            reconcile_total.clone(),
        );
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            reconcile_errors.clone(),
        );
        let reconcile_time =
            Family::<ControllerLabels, Histogram>::new_with_constructor(new_reconcile_histogram);
        registry.register_with_unit(
            "controller_runtime_reconcile_time",
            "Length of time per reconciliation per controller",
            Unit::Seconds,
            reconcile_time.clone(),
        );
        let max_concurrent = Family::<ControllerLabels, Gauge>::default();
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            max_concurrent.clone(),
        );
        let active_workers = Family::<ControllerLabels, Gauge>::default();
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            active_workers.clone(),
        );
        let leader_status = Family::<NameLabels, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            leader_status.clone(),
        );
        let rest_client_requests = crate::client_metrics::Requests::default();
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests to the API server, by verb, resource and status code",
            rest_client_requests.clone(),
        );
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        Arc::new(Metrics {
            registry: RwLock::new(registry),
            reconcile_total,
            reconcile_errors,
            reconcile_time,
            max_concurrent,
            active_workers,
            leader_status,
            rest_client_requests,
        })
    }

    /// The layer that counts a client's requests in `rest_client_requests_total` (see
    /// [`crate::client_metrics`]).
    pub fn count_requests(&self) -> crate::client_metrics::CountRequests {
        crate::client_metrics::CountRequests {
            requests: self.rest_client_requests.clone(),
        }
    }

    /// The metrics of one controller. Every series exists from the start, at zero, so rates and
    /// alerts see the controller before its first reconcile.
    pub fn controller(&self, name: &str, max_concurrent_reconciles: u16) -> ControllerMetrics {
        let labels = ControllerLabels {
            controller: name.to_string(),
        };
        self.max_concurrent
            .get_or_create(&labels)
            .set(i64::from(max_concurrent_reconciles));
        self.active_workers.get_or_create(&labels).set(0);
        let outcomes = Outcome::ALL.map(|outcome| {
            self.reconcile_total.get_or_create_owned(&ResultLabels {
                controller: name.to_string(),
                result: outcome.as_str().to_string(),
            })
        });
        ControllerMetrics {
            name: name.to_string(),
            outcomes,
            errors: self.reconcile_errors.get_or_create_owned(&labels),
            time: self.reconcile_time.get_or_create_owned(&labels),
            active_workers: self.active_workers.get_or_create_owned(&labels),
        }
    }

    /// `leader_election_master_status{name}`: 1 while this replica holds the lease `name`.
    pub fn leader_status(&self, name: &str) -> Gauge {
        self.leader_status.get_or_create_owned(&NameLabels {
            name: name.to_string(),
        })
    }

    /// Registers a gauge family with the label names `labels`, whose series `values` computes at
    /// each scrape (e.g. objects in a cache counted by state): one value per label, in order.
    /// `name` must be a valid metric name.
    pub fn register_gauge_fn<F>(
        &self,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
        values: F,
    ) where
        F: Fn() -> Vec<(Vec<String>, i64)> + Send + Sync + 'static,
    {
        let collector = GaugeFn {
            name: name.to_string(),
            help: help.to_string(),
            labels,
            values: Box::new(values),
        };
        self.registry
            .write()
            .expect("metrics registry lock")
            .register_collector(Box::new(collector));
    }

    /// The exposition, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.read().expect("metrics registry lock");
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The exposition for `Accept`, from its OpenMetrics text: as it is when asked for, else in the
/// classic text format. Two formats, because readers of the classic one (promtool check metrics,
/// older scrapers, curl users' tools) take OpenMetrics counters, named without `_total`, for
/// families with no HELP (`tests/process/probes_and_metrics.rs` shows promtool doing so).
pub fn negotiate(openmetrics: String, accept: Option<&str>) -> (&'static str, String) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS, openmetrics)
    } else {
        (PROMETHEUS_TEXT, to_prometheus_text(&openmetrics))
    }
}

/// Rewrites OpenMetrics text as Prometheus text 0.0.4: counter families are named with their
/// `_total` suffix in HELP and TYPE (OpenMetrics names the family without it), and the
/// OpenMetrics-only `# UNIT` and `# EOF` lines are dropped. Samples are identical.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split_once(' ').or(Some((rest, "")));
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let name = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn new_reconcile_histogram() -> Histogram {
    Histogram::new(RECONCILE_BUCKETS)
}

/// The handles of one controller's series.
#[derive(Clone)]
pub struct ControllerMetrics {
    name: String,
    outcomes: [Counter; 4],
    errors: Counter,
    time: Histogram,
    active_workers: Gauge,
}

impl ControllerMetrics {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts a worker busy until the returned guard drops (so a cancelled reconcile is counted
    /// out too).
    pub fn worker(&self) -> WorkerGuard {
        self.active_workers.inc();
        WorkerGuard(self.active_workers.clone())
    }

    /// Records a finished reconcile.
    pub fn observe(&self, outcome: Outcome, seconds: f64) {
        let index = Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .expect("every outcome is in ALL");
        self.outcomes[index].inc();
        if outcome == Outcome::Error {
            self.errors.inc();
        }
        self.time.observe(seconds);
    }
}

/// A busy worker; decrements `controller_runtime_active_workers` when dropped.
pub struct WorkerGuard(Gauge);

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

type ValuesFn = Box<dyn Fn() -> Vec<(Vec<String>, i64)> + Send + Sync>;

struct GaugeFn {
    name: String,
    help: String,
    labels: &'static [&'static str],
    values: ValuesFn,
}

impl std::fmt::Debug for GaugeFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GaugeFn").field("name", &self.name).finish()
    }
}

impl Collector for GaugeFn {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric =
            encoder.encode_descriptor(&self.name, &self.help, None, MetricType::Gauge)?;
        for (values, count) in (self.values)() {
            let labels: Vec<(&str, &str)> = self
                .labels
                .iter()
                .copied()
                .zip(values.iter().map(String::as_str))
                .collect();
            ConstGauge::new(count).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_exist_at_zero_before_the_first_reconcile() {
        let metrics = Metrics::new();
        metrics.controller("widgets", 7);
        let text = metrics.encode();
        for line in [
            "controller_runtime_reconcile_total{controller=\"widgets\",result=\"success\"} 0",
            "controller_runtime_reconcile_total{controller=\"widgets\",result=\"error\"} 0",
            "controller_runtime_reconcile_total{controller=\"widgets\",result=\"requeue\"} 0",
            "controller_runtime_reconcile_total{controller=\"widgets\",result=\"requeue_after\"} 0",
            "controller_runtime_reconcile_errors_total{controller=\"widgets\"} 0",
            "controller_runtime_reconcile_time_seconds_count{controller=\"widgets\"} 0",
            "controller_runtime_max_concurrent_reconciles{controller=\"widgets\"} 7",
            "controller_runtime_active_workers{controller=\"widgets\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn outcomes_workers_and_durations_are_counted() {
        let metrics = Metrics::new();
        let widgets = metrics.controller("widgets", 2);
        {
            let _busy = widgets.worker();
            let _other = widgets.worker();
            assert!(metrics
                .encode()
                .contains("controller_runtime_active_workers{controller=\"widgets\"} 2"));
        }
        widgets.observe(Outcome::Error, 0.02);
        widgets.observe(Outcome::RequeueAfter, 0.2);
        widgets.observe(Outcome::Success, 3.0);
        let text = metrics.encode();
        for line in [
            "controller_runtime_active_workers{controller=\"widgets\"} 0",
            "controller_runtime_reconcile_total{controller=\"widgets\",result=\"error\"} 1",
            "controller_runtime_reconcile_total{controller=\"widgets\",result=\"requeue_after\"} 1",
            "controller_runtime_reconcile_total{controller=\"widgets\",result=\"success\"} 1",
            "controller_runtime_reconcile_errors_total{controller=\"widgets\"} 1",
            "controller_runtime_reconcile_time_seconds_count{controller=\"widgets\"} 3",
            "controller_runtime_reconcile_time_seconds_bucket{le=\"0.025\",controller=\"widgets\"} 1",
            "controller_runtime_reconcile_time_seconds_bucket{le=\"0.25\",controller=\"widgets\"} 2",
            "controller_runtime_reconcile_time_seconds_bucket{le=\"+Inf\",controller=\"widgets\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
    }

    #[test]
    fn gauge_functions_are_read_at_each_scrape() {
        let metrics = Metrics::new();
        let count = Arc::new(std::sync::atomic::AtomicI64::new(1));
        let seen = count.clone();
        metrics.register_gauge_fn(
            "things",
            "Things by colour",
            &["colour", "size"],
            move || {
                vec![
                    (
                        vec!["red".into(), "big".into()],
                        seen.load(std::sync::atomic::Ordering::SeqCst),
                    ),
                    (vec!["blue".into(), "".into()], 0),
                ]
            },
        );
        assert!(metrics
            .encode()
            .contains("things{colour=\"red\",size=\"big\"} 1\n"));
        count.store(5, std::sync::atomic::Ordering::SeqCst);
        let text = metrics.encode();
        assert!(text.contains("# TYPE things gauge\n"));
        assert!(text.contains("things{colour=\"red\",size=\"big\"} 5\n"));
        assert!(text.contains("things{colour=\"blue\",size=\"\"} 0\n"));
    }

    #[test]
    fn the_classic_text_format_names_counters_with_their_suffix() {
        let metrics = Metrics::new();
        metrics
            .controller("widgets", 1)
            .observe(Outcome::Success, 0.1);
        let (content_type, om) = negotiate(
            metrics.encode(),
            Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
        );
        assert_eq!(content_type, OPENMETRICS);
        assert!(om.contains("# TYPE controller_runtime_reconcile counter\n"));
        let (content_type, text) = negotiate(metrics.encode(), Some("text/plain"));
        assert_eq!(content_type, PROMETHEUS_TEXT);
        assert!(
            text.contains(
                "# HELP controller_runtime_reconcile_total Total number of reconciliations per controller.\n\
                 # TYPE controller_runtime_reconcile_total counter\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "\ncontroller_runtime_reconcile_total{controller=\"widgets\",result=\"success\"} 1\n"
        ));
        assert!(text.contains("# TYPE controller_runtime_reconcile_time_seconds histogram\n"));
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
        // Same samples in both (process_* are sampled at each encode, so they may differ).
        let samples = |t: &str| {
            t.lines()
                .filter(|l| !l.starts_with('#') && !l.starts_with("process_"))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(samples(&om), samples(&text));
    }

    #[test]
    fn leader_status_is_labelled_by_lease() {
        let metrics = Metrics::new();
        metrics.leader_status("my-lease").set(1);
        assert!(metrics
            .encode()
            .contains("leader_election_master_status{name=\"my-lease\"} 1\n"));
    }
}
