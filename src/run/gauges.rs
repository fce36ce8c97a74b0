//! The domain gauges: the cached CdnClusters and Ats counted by state, at scrape time.

use crate::api::{At, CdnCluster, Outcome, Phase, State};
use crate::runtime::metrics::Metrics;
use kube::runtime::reflector::Store;
use kube::Resource;
use std::hash::Hash;

/// `cdn_operator_cdnclusters{state}`: CdnClusters in the cache by `status.state`, at scrape time.
pub fn register_cdncluster_gauges(metrics: &Metrics, clusters: Store<CdnCluster>) {
    register_count_by(
        metrics,
        "cdn_operator_cdnclusters",
        "CdnClusters by status.state (Unknown: not reconciled yet)",
        &["state"],
        clusters,
        State::ALL.iter().map(|s| [s.as_str()]).collect(),
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.state)
                .map(|s| [s.as_str()])
        },
    );
}

/// `cdn_operator_ats{phase,outcome}`: Ats in the cache by `status.phase` and, once DONE,
/// `status.outcome` (empty before), at scrape time.
pub fn register_at_gauges(metrics: &Metrics, ats: Store<At>) {
    let mut all = vec![[Phase::Pending.as_str(), ""], [Phase::Running.as_str(), ""]];
    all.extend(Outcome::ALL.map(|o| [Phase::Done.as_str(), o.as_str()]));
    register_count_by(
        metrics,
        "cdn_operator_ats",
        "Ats by status.phase and status.outcome (Unknown: not reconciled yet)",
        &["phase", "outcome"],
        ats,
        all,
        |a| {
            let status = a.status.as_ref()?;
            Some([
                status.phase?.as_str(),
                status.outcome.map_or("", Outcome::as_str),
            ])
        },
    );
}

/// A gauge family counting the cached objects by `key` (one value per label): every combination
/// in `all` is always present (at 0 when no object has it); objects without a key count under
/// `Unknown` (every label).
fn register_count_by<K, const L: usize>(
    metrics: &Metrics,
    name: &str,
    help: &str,
    labels: &'static [&'static str],
    store: Store<K>,
    all: Vec<[&'static str; L]>,
    key: fn(&K) -> Option<[&'static str; L]>,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    metrics.register_gauge_fn(name, help, labels, move || {
        let keys: Vec<Option<[&str; L]>> = store.state().iter().map(|o| key(o)).collect();
        let count = |k: Option<[&str; L]>| keys.iter().filter(|x| **x == k).count() as i64;
        let series = |values: [&str; L]| values.iter().map(|v| v.to_string()).collect::<Vec<_>>();
        all.iter()
            .map(|values| (series(*values), count(Some(*values))))
            .chain([(series(["Unknown"; L]), count(None))])
            .collect()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    #[test]
    fn domain_gauges_count_the_cache_by_state_and_phase() {
        let metrics = Metrics::new();
        let (clusters, mut cluster_writer) = reflector::store::<CdnCluster>();
        let (ats, mut at_writer) = reflector::store::<At>();
        register_cdncluster_gauges(&metrics, clusters);
        register_at_gauges(&metrics, ats);
        let cluster = |name: &str, state: Option<&str>| -> CdnCluster {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
                "metadata": {"name": name, "namespace": "n"},
                "spec": {"role": "cache", "sources": []},
                "status": state.map(|s| serde_json::json!({"state": s})),
            }))
            .unwrap()
        };
        for c in [
            cluster("a", Some("Running")),
            cluster("b", Some("Running")),
            cluster("c", None),
        ] {
            cluster_writer.apply_watcher_event(&watcher::Event::Apply(c));
        }
        let at: At = serde_json::from_value(serde_json::json!({
            "apiVersion": "cnat.programming-kubernetes.info/v1alpha1", "kind": "At",
            "metadata": {"name": "x", "namespace": "n"},
            "spec": {"schedule": "2020-01-01T00:00:00Z", "command": "echo YAY"},
            "status": {"phase": "DONE", "outcome": "Failed"},
        }))
        .unwrap();
        at_writer.apply_watcher_event(&watcher::Event::Apply(at));
        let text = metrics.encode();
        for line in [
            "cdn_operator_cdnclusters{state=\"Running\"} 2",
            "cdn_operator_cdnclusters{state=\"Unknown\"} 1",
            "cdn_operator_cdnclusters{state=\"WaitingSource\"} 0",
            "cdn_operator_cdnclusters{state=\"Deploying\"} 0",
            "cdn_operator_cdnclusters{state=\"Invalid\"} 0",
            "cdn_operator_ats{phase=\"DONE\",outcome=\"Failed\"} 1",
            "cdn_operator_ats{phase=\"DONE\",outcome=\"Succeeded\"} 0",
            "cdn_operator_ats{phase=\"PENDING\",outcome=\"\"} 0",
            "cdn_operator_ats{phase=\"RUNNING\",outcome=\"\"} 0",
            "cdn_operator_ats{phase=\"Unknown\",outcome=\"Unknown\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
    }
}
