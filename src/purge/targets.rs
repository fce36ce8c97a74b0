//! The caches a purge reaches: the CdnCluster it names and every cache cluster it fetches through,
//! ordered so that a cluster comes after every cache cluster below it. Pure: the CdnClusters are
//! looked up through a function (the cache, in the operator; a map, in tests).

use crate::api::{CdnCluster, Role};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A cache cluster a purge reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tier {
    pub name: String,
    /// The cache clusters it fetches through, directly or not (places in the list of tiers):
    /// they must be purged completely before this one's last pass, or it could fetch a purged
    /// object again from one of them.
    pub below: BTreeSet<usize>,
    /// For a cache with a volume, its replicas: its pods, `<name>-0` to `<name>-<replicas - 1>`,
    /// keep their cache when they are replaced, so a purge waits for each of them.
    pub kept: Option<i32>,
}

/// Why a purge has nothing to reach.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("there is no CdnCluster {0} in the namespace")]
    NotFound(String),
}

/// The cache clusters under `name` (itself included if a cache), each after every one below it.
/// A source that does not exist holds nothing; a cycle (an Invalid topology) is walked once.
pub fn tiers(
    name: &str,
    lookup: impl Fn(&str) -> Option<Arc<CdnCluster>>,
) -> Result<Vec<Tier>, TargetError> {
    let top = lookup(name).ok_or_else(|| TargetError::NotFound(name.to_string()))?;
    let mut walk = Walk {
        lookup: &lookup,
        tiers: Vec::new(),
        visiting: BTreeSet::new(),
    };
    walk.visit(&top);
    Ok(walk.tiers)
}

struct Walk<'a, F> {
    lookup: &'a F,
    tiers: Vec<Tier>,
    /// The clusters on the path from the top: a source among them closes a cycle.
    visiting: BTreeSet<String>,
}

impl<F: Fn(&str) -> Option<Arc<CdnCluster>>> Walk<'_, F> {
    /// Adds the cache clusters under `cluster` (and it, if a cache) after those below them;
    /// returns the places of the cache clusters it reaches, itself included.
    fn visit(&mut self, cluster: &CdnCluster) -> BTreeSet<usize> {
        let name = cluster.metadata.name.clone().unwrap_or_default();
        if let Some(done) = self.tiers.iter().position(|t| t.name == name) {
            let mut reached = self.tiers[done].below.clone();
            reached.insert(done);
            return reached;
        }
        if !self.visiting.insert(name.clone()) {
            return BTreeSet::new();
        }
        let mut below = BTreeSet::new();
        for source in cluster.spec.sources.iter().filter(|s| s.origin.is_none()) {
            if let Some(next) = (self.lookup)(&source.name) {
                below.extend(self.visit(&next));
            }
        }
        self.visiting.remove(&name);
        if cluster.spec.role != Role::Cache {
            return below;
        }
        let kept =
            crate::cdncluster::build::persistent_volume(cluster).map(|_| cluster.spec.replicas);
        self.tiers.push(Tier {
            name,
            below: below.clone(),
            kept,
        });
        below.insert(self.tiers.len() - 1);
        below
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CdnClusterSpec, Source};
    use std::collections::HashMap;

    fn world(clusters: &[(&str, Role, &[&str])]) -> HashMap<String, Arc<CdnCluster>> {
        clusters
            .iter()
            .map(|(name, role, sources)| {
                let mut sources: Vec<Source> =
                    sources.iter().map(|s| Source::cluster(s, None)).collect();
                sources.push(Source::url("origin", "http://origin.example", None));
                let c = CdnCluster::new(name, CdnClusterSpec::new(*role, sources));
                (name.to_string(), Arc::new(c))
            })
            .collect()
    }

    fn names(tiers: &[Tier]) -> Vec<(&str, Vec<&str>)> {
        tiers
            .iter()
            .map(|t| {
                let below = t.below.iter().map(|&i| tiers[i].name.as_str()).collect();
                (t.name.as_str(), below)
            })
            .collect()
    }

    #[test]
    fn a_balancer_reaches_its_caches_each_after_the_caches_below_it() {
        let w = world(&[
            ("edge", Role::Balancer, &["mid-a", "mid-b", "missing"]),
            ("mid-a", Role::Cache, &["shield"]),
            ("mid-b", Role::Cache, &["shield"]),
            ("shield", Role::Cache, &[]),
        ]);
        let tiers = tiers("edge", |n| w.get(n).cloned()).unwrap();
        assert_eq!(
            names(&tiers),
            [
                ("shield", vec![]),
                ("mid-a", vec!["shield"]),
                ("mid-b", vec!["shield"])
            ]
        );
        // Naming a cache reaches it and what is below it, not what is above.
        let tiers = super::tiers("mid-a", |n| w.get(n).cloned()).unwrap();
        assert_eq!(
            names(&tiers),
            [("shield", vec![]), ("mid-a", vec!["shield"])]
        );
    }

    #[test]
    fn a_balancer_of_origins_reaches_nothing_and_an_unknown_name_is_refused() {
        let w = world(&[
            ("edge", Role::Balancer, &[]),
            ("a", Role::Cache, &["b"]),
            ("b", Role::Cache, &["a"]),
        ]);
        assert_eq!(tiers("edge", |n| w.get(n).cloned()).unwrap(), []);
        assert_eq!(
            tiers("nope", |n| w.get(n).cloned()),
            Err(TargetError::NotFound("nope".into()))
        );
        // A cycle (Invalid, deployed by nobody) is walked once.
        let tiers = tiers("a", |n| w.get(n).cloned()).unwrap();
        assert_eq!(names(&tiers), [("b", vec![]), ("a", vec!["b"])]);
    }
}
