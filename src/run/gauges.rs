//! The domain gauges: the cached CdnClusters and Ats counted by namespace and state, at scrape
//! time, by the leader only.
//!
//! Every replica caches every object, but only the leader exports the counts: with two replicas,
//! a dashboard or alert summing the gauges would otherwise count each object twice. A standby
//! (or a replica that lost the lease) serves the families with no series, which Prometheus marks
//! stale at the next scrape.
//!
//! Cardinality: one series per namespace holding objects of the kind, times the states (6 for
//! CdnClusters, 5 for Ats): namespaces × states, not objects.

use crate::api::{At, CdnCluster, Outcome, Phase, PurgePhase, State};
use crate::purge::PurgeSummary;
use crate::runtime::leader::Leadership;
use crate::runtime::metrics::Metrics;
use kube::runtime::reflector::Store;
use kube::Resource;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// `cdn_operator_cdnclusters{namespace,state}`: CdnClusters in the cache by namespace and
/// `status.state`, at scrape time, while this replica leads.
pub fn register_cdncluster_gauges(
    metrics: &Metrics,
    clusters: Store<CdnCluster>,
    leadership: Leadership,
) {
    register_count_by(
        metrics,
        "cdn_operator_cdnclusters",
        "CdnClusters by namespace and status.state (Unknown: not reconciled yet); exported by the leader only",
        &["namespace", "state"],
        clusters,
        leadership,
        State::ALL.iter().map(|s| [s.as_str()]).collect(),
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.state)
                .map(|s| [s.as_str()])
        },
    );
}

/// `cdn_operator_ats{namespace,phase,outcome}`: Ats in the cache by namespace, `status.phase`
/// and, once DONE, `status.outcome` (empty before), at scrape time, while this replica leads.
pub fn register_at_gauges(metrics: &Metrics, ats: Store<At>, leadership: Leadership) {
    let mut all = vec![[Phase::Pending.as_str(), ""], [Phase::Running.as_str(), ""]];
    all.extend(Outcome::ALL.map(|o| [Phase::Done.as_str(), o.as_str()]));
    register_count_by(
        metrics,
        "cdn_operator_ats",
        "Ats by namespace, status.phase and status.outcome (Unknown: not reconciled yet); exported by the leader only",
        &["namespace", "phase", "outcome"],
        ats,
        leadership,
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

/// `cdn_operator_cdnpurges{namespace,phase}`: CdnPurges in the cache by namespace and
/// `status.phase`; and `cdn_operator_cdnpurge_oldest_open_seconds{namespace}`: the age of the
/// oldest purge not over yet (0 when none), what an alert on a purge that does not complete
/// reads. While this replica leads.
pub fn register_purge_gauges(
    metrics: &Metrics,
    purges: Store<PurgeSummary>,
    leadership: Leadership,
) {
    register_count_by(
        metrics,
        "cdn_operator_cdnpurges",
        "CdnPurges by namespace and status.phase (Unknown: not reconciled yet); exported by the leader only",
        &["namespace", "phase"],
        purges.clone(),
        leadership.clone(),
        PurgePhase::ALL.iter().map(|p| [p.as_str()]).collect(),
        |p| p.phase.map(|p| [p.as_str()]),
    );
    metrics.register_gauge_fn(
        "cdn_operator_cdnpurge_oldest_open_seconds",
        "Age of the oldest CdnPurge not Complete nor Failed, by namespace (0: none); exported by the leader only",
        &["namespace"],
        move || {
            if !leadership.is_leader() {
                return Vec::new();
            }
            let now = jiff::Timestamp::now();
            let mut oldest: BTreeMap<String, i64> = BTreeMap::new();
            for purge in purges.state() {
                let namespace = purge.metadata.namespace.clone().unwrap_or_default();
                let age = match (&purge.open, &purge.metadata.creation_timestamp) {
                    (Some(_), Some(created)) => now.duration_since(created.0).as_secs().max(0),
                    _ => 0,
                };
                let entry = oldest.entry(namespace).or_default();
                *entry = (*entry).max(age);
            }
            oldest
                .into_iter()
                .map(|(namespace, age)| (vec![namespace], age))
                .collect()
        },
    );
}

/// A gauge family counting the cached objects by namespace and `key` (one value per label after
/// `namespace`): in every namespace holding such objects, every combination in `all` is present
/// (at 0 when no object has it); objects without a key count under `Unknown` (every label).
/// Nothing while `leadership` says this replica does not lead.
#[allow(clippy::too_many_arguments)]
fn register_count_by<K, const L: usize>(
    metrics: &Metrics,
    name: &str,
    help: &str,
    labels: &'static [&'static str],
    store: Store<K>,
    leadership: Leadership,
    all: Vec<[&'static str; L]>,
    key: fn(&K) -> Option<[&'static str; L]>,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    assert_eq!(
        labels.len(),
        L + 1,
        "{name}: namespace and the key's labels"
    );
    metrics.register_gauge_fn(name, help, labels, move || {
        if !leadership.is_leader() {
            return Vec::new();
        }
        let mut counts: BTreeMap<String, HashMap<Option<[&str; L]>, i64>> = BTreeMap::new();
        for object in store.state() {
            let namespace = object.meta().namespace.clone().unwrap_or_default();
            *counts
                .entry(namespace)
                .or_default()
                .entry(key(&object))
                .or_default() += 1;
        }
        let mut series = Vec::new();
        for (namespace, by_key) in counts {
            let keys = all.iter().map(|values| Some(*values)).chain([None]);
            for k in keys {
                let mut values = vec![namespace.clone()];
                values.extend(k.unwrap_or(["Unknown"; L]).iter().map(|v| v.to_string()));
                series.push((values, by_key.get(&k).copied().unwrap_or(0)));
            }
        }
        series
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    fn cluster(name: &str, namespace: &str, state: Option<&str>) -> CdnCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"role": "cache", "sources": []},
            "status": state.map(|s| serde_json::json!({"state": s})),
        }))
        .unwrap()
    }

    #[test]
    fn domain_gauges_count_the_cache_by_namespace_and_state_and_phase() {
        let metrics = Metrics::new();
        let (clusters, mut cluster_writer) = reflector::store::<CdnCluster>();
        let (ats, mut at_writer) = reflector::store::<At>();
        register_cdncluster_gauges(&metrics, clusters, Leadership::always());
        register_at_gauges(&metrics, ats, Leadership::always());
        for c in [
            cluster("a", "n", Some("Running")),
            cluster("b", "n", Some("Running")),
            cluster("c", "n", None),
            cluster("a", "m", Some("WaitingSource")),
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
            "cdn_operator_cdnclusters{namespace=\"n\",state=\"Running\"} 2",
            "cdn_operator_cdnclusters{namespace=\"n\",state=\"Unknown\"} 1",
            "cdn_operator_cdnclusters{namespace=\"n\",state=\"WaitingSource\"} 0",
            "cdn_operator_cdnclusters{namespace=\"n\",state=\"Deploying\"} 0",
            "cdn_operator_cdnclusters{namespace=\"n\",state=\"Invalid\"} 0",
            "cdn_operator_cdnclusters{namespace=\"m\",state=\"WaitingSource\"} 1",
            "cdn_operator_cdnclusters{namespace=\"m\",state=\"Running\"} 0",
            "cdn_operator_cdnclusters{namespace=\"m\",state=\"Unknown\"} 0",
            "cdn_operator_ats{namespace=\"n\",phase=\"DONE\",outcome=\"Failed\"} 1",
            "cdn_operator_ats{namespace=\"n\",phase=\"DONE\",outcome=\"Succeeded\"} 0",
            "cdn_operator_ats{namespace=\"n\",phase=\"PENDING\",outcome=\"\"} 0",
            "cdn_operator_ats{namespace=\"n\",phase=\"RUNNING\",outcome=\"\"} 0",
            "cdn_operator_ats{namespace=\"n\",phase=\"Unknown\",outcome=\"Unknown\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
        // A namespace with no At has no At series; 6 states × 2 namespaces, 5 At keys × 1.
        assert!(!text.contains("cdn_operator_ats{namespace=\"m\""), "{text}");
        let samples = |family: &str| {
            text.lines()
                .filter(|l| l.starts_with(&format!("{family}{{")))
                .count()
        };
        assert_eq!(samples("cdn_operator_cdnclusters"), 12, "{text}");
        assert_eq!(samples("cdn_operator_ats"), 5, "{text}");
    }

    #[test]
    fn only_the_leader_exports_domain_gauges() {
        let metrics = Metrics::new();
        let (clusters, mut writer) = reflector::store::<CdnCluster>();
        let leadership = Leadership::standby();
        register_cdncluster_gauges(&metrics, clusters, leadership.clone());
        writer.apply_watcher_event(&watcher::Event::Apply(cluster("a", "n", Some("Running"))));
        let running = "cdn_operator_cdnclusters{namespace=\"n\",state=\"Running\"} 1";
        let standby = metrics.encode();
        assert!(standby.contains("# TYPE cdn_operator_cdnclusters gauge"));
        assert!(!standby.contains("cdn_operator_cdnclusters{"), "{standby}");
        leadership.set(true);
        let leading = metrics.encode();
        assert!(leading.lines().any(|l| l == running), "{leading}");
        // Losing the lease stops the export at once (the next scrape).
        leadership.set(false);
        assert!(!metrics.encode().contains("cdn_operator_cdnclusters{"));
    }
}
