//! The pods a purge reaches, by CdnCluster, kept from the watch of the CdnClusters' pods (the
//! one that feeds their problems): a pass reads them at once. Listing them from the API server
//! for each pass made a burst of purges wait: under load a list took seconds, queued behind the
//! purges' own writes, and every pass of every purge waited for it.

use crate::kubernetes::index::{Index, Reset};
use crate::kubernetes::problems::PodSummary;
use crate::nginx_metrics;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

/// A pod of a tier, as the watch last told it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub uid: String,
    pub name: String,
    /// Its sidecar's address; `None` when the pod has no sidecar.
    pub sidecar: Option<SocketAddr>,
}

impl Target {
    /// `pod` as a purge reaches it: running with an address (a pod not started yet holds
    /// nothing), its sidecar's port from its spec. `None` for a pod that holds no cache.
    pub fn of(pod: &PodSummary) -> Option<Target> {
        let ip = pod.running_at?;
        let port = pod
            .ports
            .iter()
            .find(|(name, _)| name == nginx_metrics::PORT_NAME)
            .map(|&(_, port)| port);
        Some(Target {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            name: pod.metadata.name.clone()?,
            sidecar: port.map(|port| SocketAddr::new(ip, port)),
        })
    }
}

/// The pods (by name) of each CdnCluster (by namespace and name).
type ByCluster = HashMap<(String, String), BTreeMap<String, Target>>;

/// The running pods of every CdnCluster. Cheap to clone: every clone reads the same cache.
#[derive(Clone, Default)]
pub struct PodTargets {
    by_cluster: Arc<RwLock<ByCluster>>,
}

impl PodTargets {
    /// The running pods of CdnCluster `cluster` of `namespace`.
    pub fn of(&self, namespace: &str, cluster: &str) -> Vec<Target> {
        let all = self.by_cluster.read().expect("never poisoned");
        all.get(&(namespace.to_string(), cluster.to_string()))
            .map(|pods| pods.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The writer the pods' watch feeds.
    pub fn writer(&self) -> PodTargetsWriter {
        PodTargetsWriter {
            targets: self.clone(),
            listing: None,
        }
    }
}

/// Fills [`PodTargets`] from watch events.
pub struct PodTargetsWriter {
    targets: PodTargets,
    /// The pods of a (re)list so far: they replace the cache at its end.
    listing: Option<ByCluster>,
}

/// Sets `pod` in `all` (or removes it: gone, or not running).
fn set(all: &mut ByCluster, pod: &PodSummary, present: bool) {
    let (Some(cluster), Some(name)) = (pod.instance(), pod.metadata.name.as_deref()) else {
        return;
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let key = (namespace, cluster.to_string());
    match Target::of(pod).filter(|_| present) {
        Some(target) => {
            all.entry(key).or_default().insert(name.to_string(), target);
        }
        None => {
            if let Some(pods) = all.get_mut(&key) {
                pods.remove(name);
                if pods.is_empty() {
                    all.remove(&key);
                }
            }
        }
    }
}

impl Index<PodSummary> for PodTargetsWriter {
    /// Never a change that calls for a CdnCluster's reconcile: its problems tell those.
    fn apply(&mut self, pod: &PodSummary) -> bool {
        set(
            &mut self.targets.by_cluster.write().expect("never poisoned"),
            pod,
            true,
        );
        false
    }

    fn delete(&mut self, pod: &PodSummary) {
        set(
            &mut self.targets.by_cluster.write().expect("never poisoned"),
            pod,
            false,
        );
    }

    fn reset(&mut self, step: Reset<'_, PodSummary>) {
        match step {
            Reset::Begin => self.listing = Some(HashMap::new()),
            Reset::Listed(pod) => {
                if let Some(listing) = &mut self.listing {
                    set(listing, pod, true);
                }
            }
            Reset::Done => {
                if let Some(listed) = self.listing.take() {
                    *self.targets.by_cluster.write().expect("never poisoned") = listed;
                }
            }
        }
    }
}

/// A pod of `cluster` in namespace `ns` as the watch tells it, its sidecar on `sidecar_port`.
#[cfg(test)]
pub(super) fn test_pod(
    name: &str,
    cluster: &str,
    phase: &str,
    ip: Option<&str>,
    sidecar_port: u16,
) -> PodSummary {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                     "labels": {"app.kubernetes.io/instance": cluster, "deployment": "x"}},
        "spec": {
            "initContainers": [{"name": "metrics", "ports": [
                {"name": nginx_metrics::PORT_NAME, "containerPort": sidecar_port}]}],
            "containers": [{"name": "nginx", "ports": [{"name": "http", "containerPort": 8080}]}],
        },
        "status": {"phase": phase, "podIP": ip},
    }))
    .unwrap();
    PodSummary::of(&pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, cluster: &str, phase: &str, ip: Option<&str>) -> PodSummary {
        test_pod(name, cluster, phase, ip, 9113)
    }

    #[test]
    fn the_running_pods_of_each_cluster_with_their_sidecars() {
        let targets = PodTargets::default();
        let mut writer = targets.writer();
        writer.reset(Reset::Begin);
        writer.reset(Reset::Listed(&pod("a-1", "a", "Running", Some("10.0.0.1"))));
        writer.reset(Reset::Listed(&pod("a-2", "a", "Pending", None)));
        writer.reset(Reset::Listed(&pod("b-1", "b", "Running", Some("10.0.0.3"))));
        assert!(
            targets.of("ns", "a").is_empty(),
            "not before the list is done"
        );
        writer.reset(Reset::Done);
        assert_eq!(
            targets.of("ns", "a"),
            [Target {
                uid: "a-1-uid".into(),
                name: "a-1".into(),
                sidecar: Some("10.0.0.1:9113".parse().unwrap()),
            }]
        );
        // a-2 starts: it is reached; it never tells a CdnCluster's reconcile.
        assert!(!writer.apply(&pod("a-2", "a", "Running", Some("10.0.0.2"))));
        let names =
            |c: &str| -> Vec<String> { targets.of("ns", c).into_iter().map(|t| t.name).collect() };
        assert_eq!(names("a"), ["a-1", "a-2"]);
        // a-1 stops running, b-1 is deleted.
        writer.apply(&pod("a-1", "a", "Succeeded", Some("10.0.0.1")));
        writer.delete(&pod("b-1", "b", "Running", Some("10.0.0.3")));
        assert_eq!(names("a"), ["a-2"]);
        assert!(names("b").is_empty());
        assert!(names("other").is_empty());
    }
}
