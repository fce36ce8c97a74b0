//! What each CdnCluster's last successful reconcile read and left behind, by resourceVersion, so
//! that a reconcile finding the same versions ends at once. Its own writes come back to it as
//! watch events and trigger one more reconcile, which has nothing to do: building and comparing
//! every child again cost as much as the reconcile that wrote them.

use crate::api::CdnCluster;
use crate::kubernetes::index::{Index, Reset};
use kube::ResourceExt;
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The resourceVersions a reconcile of one CdnCluster depends on: its own, those of the
/// CdnClusters its sources were looked up as (absent ones too), and its children's (by kind).
/// Everything else a reconcile reads is fixed for the process (the pod security settings) or
/// comes from these objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionSet {
    cluster: Option<String>,
    sources: Vec<(String, Option<String>)>,
    children: Vec<(Cow<'static, str>, Option<String>)>,
}

impl VersionSet {
    /// The CdnCluster at `cluster` and what resolving its sources looked up, in any order and
    /// with repeats (a walk of the source graph may look a name up twice).
    pub fn new(cluster: Option<String>, mut sources: Vec<(String, Option<String>)>) -> Self {
        sources.sort();
        sources.dedup();
        VersionSet {
            cluster,
            sources,
            children: Vec::new(),
        }
    }

    /// The CdnCluster's version is now `version` (its status was written).
    pub fn set_cluster(&mut self, version: Option<String>) {
        self.cluster = version;
    }

    /// The child of kind `kind` is at `version` (`None`: there is none).
    pub fn set_child(&mut self, kind: Cow<'static, str>, version: Option<String>) {
        match self.children.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, v)) => *v = version,
            None => {
                self.children.push((kind, version));
                self.children.sort();
            }
        }
    }

    /// A hash of the versions; `None` when the CdnCluster has no version (an object the server
    /// did not return), which is never taken as unchanged.
    fn fingerprint(&self) -> Option<u64> {
        self.cluster.as_ref()?;
        let mut hasher = DefaultHasher::new();
        self.hash(&mut hasher);
        Some(hasher.finish())
    }
}

impl Hash for VersionSet {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (&self.cluster, &self.sources, &self.children).hash(state);
    }
}

/// The [`VersionSet`] each CdnCluster's last successful reconcile left, hashed, by CdnCluster.
/// Cheap to clone: every clone is the same. Two words an entry: 20 to 40 bytes per CdnCluster
/// with the table's free slots.
#[derive(Clone, Default)]
pub struct Settled {
    by_cluster: Arc<Mutex<HashMap<u64, u64>>>,
    skipped: Arc<AtomicU64>,
}

impl Settled {
    /// Whether `namespace/name` is still at the `versions` its last successful reconcile left;
    /// counted in [`Settled::skipped`] when it is.
    pub fn unchanged(&self, namespace: &str, name: &str, versions: &VersionSet) -> bool {
        let Some(fingerprint) = versions.fingerprint() else {
            return false;
        };
        let unchanged = self.lock().get(&key(namespace, name)) == Some(&fingerprint);
        if unchanged {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        unchanged
    }

    /// A reconcile of `namespace/name` succeeded and left `versions`.
    pub fn settled(&self, namespace: &str, name: &str, versions: &VersionSet) {
        let key = key(namespace, name);
        match versions.fingerprint() {
            Some(fingerprint) => self.lock().insert(key, fingerprint),
            None => self.lock().remove(&key),
        };
    }

    /// A reconcile of `namespace/name` failed, or the CdnCluster is gone: its next reconcile
    /// runs whole.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.lock().remove(&key(namespace, name));
    }

    /// The CdnClusters were listed again (events may have been missed): every next reconcile
    /// runs whole, and those deleted meanwhile leave nothing behind.
    pub fn forget_all(&self) {
        let mut by_cluster = self.lock();
        by_cluster.clear();
        by_cluster.shrink_to_fit();
    }

    /// How many reconciles ended at once, found unchanged.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// How many CdnClusters have settled versions.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u64>> {
        self.by_cluster.lock().expect("never poisoned")
    }
}

/// Fed by the CdnCluster watch: a CdnCluster deleted leaves nothing behind, and a list of them
/// all (events may have been missed) has every next reconcile run whole.
impl Index<CdnCluster> for Settled {
    fn apply(&mut self, _: &CdnCluster) -> bool {
        false
    }

    fn delete(&mut self, gone: &CdnCluster) {
        self.forget(&gone.namespace().unwrap_or_default(), &gone.name_any());
    }

    fn reset(&mut self, step: Reset<'_, CdnCluster>) {
        if let Reset::Begin = step {
            self.forget_all();
        }
    }
}

/// The key of `namespace/name`: a hash, as a string key would cost more than the entry. Two
/// CdnClusters sharing one (once in 2^64) only share an entry: each one's versions differ from
/// the other's, resourceVersions being unique, so neither is skipped wrongly.
fn key(namespace: &str, name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (namespace, name).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    fn settled_at(versions: &VersionSet) -> Settled {
        let settled = Settled::default();
        settled.settled("ns", "a", versions);
        settled
    }

    fn versions() -> VersionSet {
        let mut versions = VersionSet::new(
            v("10"),
            vec![
                ("b".into(), v("7")),
                ("c".into(), None),
                ("b".into(), v("7")),
            ],
        );
        versions.set_child("ConfigMap".into(), v("11"));
        versions.set_child("Deployment".into(), v("12"));
        versions
    }

    #[test]
    fn the_same_versions_are_unchanged_whatever_the_lookup_order() {
        let settled = settled_at(&versions());
        let mut again = VersionSet::new(v("10"), vec![("c".into(), None), ("b".into(), v("7"))]);
        again.set_child("Deployment".into(), v("12"));
        again.set_child("ConfigMap".into(), v("11"));
        assert!(settled.unchanged("ns", "a", &again));
        assert_eq!(settled.skipped(), 1);
        // Another CdnCluster with the same versions is not this one.
        assert!(!settled.unchanged("ns", "b", &again));
        assert!(!settled.unchanged("other", "a", &again));
        assert_eq!(settled.skipped(), 1);
    }

    #[test]
    fn any_version_changed_appeared_or_gone_is_a_change() {
        let settled = settled_at(&versions());
        let changes: [fn(&mut VersionSet); 6] = [
            |x| x.set_cluster(v("13")),
            |x| x.sources[0].1 = v("8"),
            |x| x.sources[1].1 = v("9"),
            |x| x.sources.push(("d".into(), None)),
            |x| x.set_child("Deployment".into(), None),
            |x| x.set_child("Service".into(), v("14")),
        ];
        for change in changes {
            let mut changed = versions();
            change(&mut changed);
            assert!(!settled.unchanged("ns", "a", &changed), "{changed:?}");
        }
        assert_eq!(settled.skipped(), 0);
    }

    #[test]
    fn without_its_own_version_a_cluster_is_never_unchanged() {
        let mut unversioned = versions();
        unversioned.set_cluster(None);
        let settled = settled_at(&versions());
        settled.settled("ns", "a", &unversioned);
        assert!(settled.is_empty(), "settling without a version forgets");
        settled.settled("ns", "a", &unversioned);
        assert!(!settled.unchanged("ns", "a", &unversioned));
    }

    #[test]
    fn forgotten_clusters_run_whole() {
        let settled = settled_at(&versions());
        settled.settled("ns", "b", &versions());
        settled.forget("ns", "a");
        assert!(!settled.unchanged("ns", "a", &versions()));
        assert!(settled.unchanged("ns", "b", &versions()));
        settled.forget_all();
        assert!(!settled.unchanged("ns", "b", &versions()));
        assert!(settled.is_empty());
    }
}
