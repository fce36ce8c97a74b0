//! What a reconcile wrote: the children it changed (for the Events), and the waits until the
//! caches show its writes; and what applying one child found and did ([`ChildApplied`]).

use super::status::ChildChange;
use crate::kubernetes::apply::Change;
use crate::kubernetes::arrivals::Arrivals;
use crate::kubernetes::cache;
use crate::kubernetes::compact::Compact;
use crate::kubernetes::index::Versions;
use crate::kubernetes::record::Record;
use crate::kubernetes::records::Records;
use futures::future::BoxFuture;
use futures::FutureExt;
use kube::{Resource, ResourceExt};
use std::time::Duration;

/// What [`apply_child`] found and did: the child's cached copy, and the change and the server's
/// answer (what the cache reads of it) if a request was sent. Kept beside [`Written::child`],
/// which records it, so that `children.rs` looks down to this file and this file not back.
pub(super) type ChildApplied<K> = (Option<Record>, Option<(Change, Compact<K>)>);

/// What a reconcile wrote: the children it changed (for the Events), and for each write the wait
/// (at most `within`) until the caches show it (futures do nothing until awaited).
pub(super) struct Written {
    pub(super) changes: Vec<ChildChange>,
    visible: Vec<BoxFuture<'static, ()>>,
    within: Duration,
}

impl Written {
    /// Nothing written yet.
    pub(super) fn new(within: Duration) -> Self {
        Written {
            changes: Vec::new(),
            visible: Vec::new(),
            within,
        }
    }

    /// Notes a write of `namespace/name`, cached in `cache` (whose waits are `arrivals`) at
    /// version `before`, answered with `after` (`None`: deleted).
    pub(super) fn wrote<C: Versions>(
        &mut self,
        cache: &C,
        arrivals: &Arrivals,
        (namespace, name): (&str, &str),
        before: Option<String>,
        after: Option<String>,
    ) {
        let (store, arrivals, within) = (cache.clone(), arrivals.clone(), self.within);
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.visible.push(
            async move {
                let (namespace, name) = (namespace.as_str(), name.as_str());
                cache::until_visible(&store, &arrivals, namespace, name, before, after, within)
                    .await
            }
            .boxed(),
        );
    }

    /// Waits until the caches hold what this reconcile wrote, so the reconciles its writes
    /// trigger read them instead of writing them again.
    pub(super) async fn until_visible(self) {
        futures::future::join_all(self.visible).await;
    }

    /// Records the deletion of the child `name`, cached in `cache` at `before`.
    pub(super) fn deleted(
        &mut self,
        cache: &Records,
        (namespace, name): (&str, &str),
        before: &Record,
    ) {
        let before = Some(before.version.to_string());
        self.wrote(cache, cache.arrivals(), (namespace, name), before, None);
    }

    /// Records what [`apply_child`] did to a child cached in `cache`, and passes on its cached
    /// copy and, if a request was sent, the server's answer.
    pub(super) fn child<K: Resource<DynamicType = ()>>(
        &mut self,
        cache: &Records,
        namespace: &str,
        (observed, applied): ChildApplied<K>,
    ) -> (Option<Record>, Option<Compact<K>>) {
        let Some((change, applied)) = applied else {
            return (observed, None);
        };
        self.changes.push(ChildChange {
            child: applied.object_ref(&()),
            change,
        });
        let before = observed.as_ref().map(|o| o.version.to_string());
        self.wrote(
            cache,
            cache.arrivals(),
            (namespace, &applied.name_any()),
            before,
            applied.resource_version(),
        );
        (observed, Some(applied))
    }
}
