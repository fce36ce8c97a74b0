//! What the benchmark reads from the operator's own /metrics: its CdnCluster reconciles.

use cdn_operator_e2e::Operator;

/// The operator's CdnCluster reconciles so far: how many (`controller_runtime_reconcile_total`),
/// and their time (`controller_runtime_reconcile_time_seconds`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reconciles {
    pub count: f64,
    seconds: f64,
    pub over_1s: f64,
}

impl Reconciles {
    pub fn of(operator: &Operator) -> Option<Reconciles> {
        let labels = "controller=\"cdncluster\"";
        let metric = |name: &str, labels: &str| operator.metric_sum(name, labels);
        let time = "controller_runtime_reconcile_time_seconds";
        let timed = metric(&format!("{time}_count"), labels)?;
        let within_1s = metric(&format!("{time}_bucket"), &format!("le=\"1.0\",{labels}"))?;
        Some(Reconciles {
            count: metric("controller_runtime_reconcile_total", labels)?,
            seconds: metric(&format!("{time}_sum"), labels)?,
            over_1s: timed - within_1s,
        })
    }

    pub fn since(self, before: Reconciles) -> Reconciles {
        Reconciles {
            count: self.count - before.count,
            seconds: self.seconds - before.seconds,
            over_1s: self.over_1s - before.over_1s,
        }
    }

    pub fn mean_ms(self) -> f64 {
        self.seconds * 1000.0 / self.count
    }
}
