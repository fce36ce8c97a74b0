//! Which CdnClusters to reconcile again when one changes: those that list it as a source. Pure.

use crate::api::CdnCluster;
use crate::kubernetes::compact::Key;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use kube::ResourceExt;
use std::collections::HashMap;

/// Whether a new version of a CdnCluster can change what its parents build or report: its
/// existence, its identity (one deleted and created again, the two events possibly folded into
/// one by a re-list, is checked again) and its spec (its sources make or break cycles). Not its status, which the operator itself writes at every transition.
pub fn concerns_parents(old: Option<&CdnCluster>, new: &CdnCluster) -> bool {
    old.is_none_or(|old| {
        old.uid() != new.uid() || old.metadata.generation != new.metadata.generation
    })
}

/// `namespace/source` → the names of the CdnClusters of that namespace listing that source,
/// sorted. One key string and a boxed slice: most sources have one parent, and a tree and two
/// strings per edge cost several times what the edge says (3 MiB for 10,000 CdnClusters).
type BySource = HashMap<Key, Box<[Box<str>]>>;

/// An index of the CdnClusters by the CdnClusters they list as sources, kept up to date from the
/// watch events. Looking parents up in it costs the same whatever the number of CdnClusters;
/// scanning the whole cache each time one appeared made creating N of them cost N².
#[derive(Default)]
pub struct Parents {
    by_source: BySource,
    /// The index being rebuilt while the watch lists again (its `Init` … `InitDone`).
    relisting: Option<BySource>,
}

impl Parents {
    /// The CdnClusters listing `changed` as a source.
    pub fn of(&self, changed: &CdnCluster) -> Vec<ObjectRef<CdnCluster>> {
        let namespace = changed.namespace().unwrap_or_default();
        self.by_source
            .get(&Key::new(&namespace, &changed.name_any()))
            .into_iter()
            .flatten()
            .map(|parent| ObjectRef::new(parent).within(&namespace))
            .collect()
    }

    /// Takes a watch event; `old` is the object's version before it (the cache's).
    pub fn observe(&mut self, event: &Event<CdnCluster>, old: Option<&CdnCluster>) {
        match event {
            Event::Apply(new) => {
                if let Some(old) = old {
                    edges(&mut self.by_source, old, false);
                }
                edges(&mut self.by_source, new, true);
            }
            Event::Delete(gone) => edges(&mut self.by_source, old.unwrap_or(gone), false),
            Event::Init => self.relisting = Some(BySource::new()),
            Event::InitApply(new) => edges(self.relisting.get_or_insert_default(), new, true),
            // What was not listed again is gone, deletions included.
            Event::InitDone => self.by_source = self.relisting.take().unwrap_or_default(),
        }
    }
}

/// Adds (or removes) the edges from `cluster`'s CdnCluster sources to `cluster`.
fn edges(index: &mut BySource, cluster: &CdnCluster, add: bool) {
    let namespace = cluster.namespace().unwrap_or_default();
    let parent = cluster.name_any();
    let sources = cluster.spec.sources.iter().filter(|s| s.origin.is_none());
    for source in sources {
        let key = Key::new(&namespace, &source.name);
        let mut parents = index.remove(&key).map(Vec::from).unwrap_or_default();
        // Nothing to do if already there (a source listed twice) or already gone.
        match (
            add,
            parents.binary_search_by(|p| (**p).cmp(parent.as_str())),
        ) {
            (true, Err(at)) => parents.insert(at, parent.as_str().into()),
            (false, Ok(at)) => drop(parents.remove(at)),
            _ => {}
        }
        if !parents.is_empty() {
            index.insert(key, parents.into_boxed_slice());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CdnClusterSpec, Role, Source};

    fn cluster(namespace: &str, name: &str, sources: &[&str]) -> CdnCluster {
        let sources = sources.iter().map(|s| Source::cluster(s, None)).collect();
        let mut c = CdnCluster::new(name, CdnClusterSpec::new(Role::Balancer, sources));
        c.metadata.namespace = Some(namespace.into());
        c
    }

    fn names(refs: Vec<ObjectRef<CdnCluster>>) -> Vec<String> {
        refs.into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect()
    }

    #[test]
    fn parents_follow_applies_spec_changes_and_deletions() {
        let mut index = Parents::default();
        let cache = cluster("a", "cache", &[]);
        let lb1 = cluster("a", "lb1", &["cache"]);
        let lb2 = cluster("a", "lb2", &["cache", "other"]);
        for c in [&lb1, &lb2] {
            index.observe(&Event::Apply(c.clone()), None);
        }
        // The same name in another namespace is another CdnCluster.
        index.observe(&Event::Apply(cluster("b", "lb3", &["cache"])), None);
        assert_eq!(names(index.of(&cache)), ["a/lb1", "a/lb2"]);

        let lb1_moved = cluster("a", "lb1", &["other"]);
        index.observe(&Event::Apply(lb1_moved.clone()), Some(&lb1));
        assert_eq!(names(index.of(&cache)), ["a/lb2"]);
        assert_eq!(
            names(index.of(&cluster("a", "other", &[]))),
            ["a/lb1", "a/lb2"]
        );

        index.observe(&Event::Delete(lb2.clone()), Some(&lb2));
        assert!(index.of(&cache).is_empty());
        index.observe(&Event::Delete(lb1_moved.clone()), None);
        assert!(index.of(&cluster("a", "other", &[])).is_empty());
        assert_eq!(index.by_source.len(), 1, "only b/cache is still listed");
    }

    #[test]
    fn a_relist_forgets_what_it_does_not_list_again() {
        let mut index = Parents::default();
        let source = cluster("a", "cache", &[]);
        index.observe(&Event::Apply(cluster("a", "gone", &["cache"])), None);
        index.observe(&Event::Init, None);
        index.observe(&Event::InitApply(cluster("a", "kept", &["cache"])), None);
        assert_eq!(
            names(index.of(&source)),
            ["a/gone"],
            "until the relist ends"
        );
        index.observe(&Event::InitDone, None);
        assert_eq!(names(index.of(&source)), ["a/kept"]);
    }

    #[test]
    fn a_source_listed_twice_makes_one_parent_and_goes_at_once() {
        let mut index = Parents::default();
        let source = cluster("a", "cache", &[]);
        let pool = cluster("a", "lb", &["cache", "cache"]);
        index.observe(&Event::Apply(cluster("a", "z", &["cache"])), None);
        index.observe(&Event::Apply(pool.clone()), None);
        assert_eq!(names(index.of(&source)), ["a/lb", "a/z"]);
        index.observe(&Event::Delete(pool.clone()), Some(&pool));
        assert_eq!(names(index.of(&source)), ["a/z"]);
    }

    #[test]
    fn origins_are_not_parents_links() {
        let mut index = Parents::default();
        let mut lb = cluster("a", "lb", &[]);
        lb.spec
            .sources
            .push(Source::url("cache", "http://cache.example.com", None));
        index.observe(&Event::Apply(lb), None);
        assert!(index.of(&cluster("a", "cache", &[])).is_empty());
    }
}
