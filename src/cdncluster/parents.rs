//! Which CdnClusters to reconcile again when one changes: those that list it as a source. The
//! index is pure; [`ParentsWatch`] feeds it from the CdnCluster watch.

use crate::api::CdnCluster;
use crate::kubernetes::index::{Index, Reset};
use crate::kubernetes::records::Key;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use std::collections::HashMap;
use tokio::sync::mpsc::UnboundedSender;

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

    /// `new` replaced `old` (the cache's copy, if any).
    pub fn apply(&mut self, old: Option<&CdnCluster>, new: &CdnCluster) {
        if let Some(old) = old {
            edges(&mut self.by_source, old, false);
        }
        edges(&mut self.by_source, new, true);
    }

    /// `gone` was deleted.
    pub fn delete(&mut self, gone: &CdnCluster) {
        edges(&mut self.by_source, gone, false);
    }

    /// A step of a list of every CdnCluster, which replaces the index at its end.
    pub fn reset(&mut self, step: Reset<'_, CdnCluster>) {
        match step {
            Reset::Begin => self.relisting = Some(BySource::new()),
            Reset::Listed(new) => edges(self.relisting.get_or_insert_default(), new, true),
            // What was not listed again is gone, deletions included.
            Reset::Done => self.by_source = self.relisting.take().unwrap_or_default(),
        }
    }
}

/// The CdnCluster watch's [`Parents`]: kept up to date from the events, each read against the
/// cache's previous copy, and telling `parents` the CdnClusters to reconcile again when a source
/// of theirs changed in a way that [`concerns_parents`]. Not on a (re)list: every CdnCluster is
/// reconciled then anyway.
pub struct ParentsWatch {
    pub index: Parents,
    pub cache: Store<CdnCluster>,
    pub parents: UnboundedSender<ObjectRef<CdnCluster>>,
}

impl ParentsWatch {
    fn tell(&self, changed: &CdnCluster) {
        for parent in self.index.of(changed) {
            let _ = self.parents.send(parent);
        }
    }
}

impl Index<CdnCluster> for ParentsWatch {
    fn apply(&mut self, new: &CdnCluster) -> bool {
        let old = self.cache.get(&ObjectRef::from_obj(new));
        if concerns_parents(old.as_deref(), new) {
            self.tell(new);
        }
        self.index.apply(old.as_deref(), new);
        false
    }

    fn delete(&mut self, gone: &CdnCluster) {
        self.tell(gone);
        let old = self.cache.get(&ObjectRef::from_obj(gone));
        self.index.delete(old.as_deref().unwrap_or(gone));
    }

    fn reset(&mut self, step: Reset<'_, CdnCluster>) {
        self.index.reset(step);
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
            index.apply(None, c);
        }
        // The same name in another namespace is another CdnCluster.
        index.apply(None, &cluster("b", "lb3", &["cache"]));
        assert_eq!(names(index.of(&cache)), ["a/lb1", "a/lb2"]);

        let lb1_moved = cluster("a", "lb1", &["other"]);
        index.apply(Some(&lb1), &lb1_moved);
        assert_eq!(names(index.of(&cache)), ["a/lb2"]);
        assert_eq!(
            names(index.of(&cluster("a", "other", &[]))),
            ["a/lb1", "a/lb2"]
        );

        index.delete(&lb2);
        assert!(index.of(&cache).is_empty());
        index.delete(&lb1_moved);
        assert!(index.of(&cluster("a", "other", &[])).is_empty());
        assert_eq!(index.by_source.len(), 1, "only b/cache is still listed");
    }

    #[test]
    fn a_relist_forgets_what_it_does_not_list_again() {
        let mut index = Parents::default();
        let source = cluster("a", "cache", &[]);
        index.apply(None, &cluster("a", "gone", &["cache"]));
        index.reset(Reset::Begin);
        index.reset(Reset::Listed(&cluster("a", "kept", &["cache"])));
        assert_eq!(
            names(index.of(&source)),
            ["a/gone"],
            "until the relist ends"
        );
        index.reset(Reset::Done);
        assert_eq!(names(index.of(&source)), ["a/kept"]);
    }

    #[test]
    fn a_source_listed_twice_makes_one_parent_and_goes_at_once() {
        let mut index = Parents::default();
        let source = cluster("a", "cache", &[]);
        let pool = cluster("a", "lb", &["cache", "cache"]);
        index.apply(None, &cluster("a", "z", &["cache"]));
        index.apply(None, &pool);
        assert_eq!(names(index.of(&source)), ["a/lb", "a/z"]);
        index.delete(&pool);
        assert_eq!(names(index.of(&source)), ["a/z"]);
    }

    #[test]
    fn origins_are_not_parents_links() {
        let mut index = Parents::default();
        let mut lb = cluster("a", "lb", &[]);
        lb.spec
            .sources
            .push(Source::url("cache", "http://cache.example.com", None));
        index.apply(None, &lb);
        assert!(index.of(&cluster("a", "cache", &[])).is_empty());
    }
}
