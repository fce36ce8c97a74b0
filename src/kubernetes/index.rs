//! What every consumer of a watch is: an [`Index`] the watch's events feed (a cache, the index of
//! the CdnClusters by source, the settled versions), and what a cache answers of an object it
//! holds ([`Versions`]). One shape for all, as linkerd's `kubert::index`: apply, delete, reset.

use kube::runtime::reflector::{store::Writer, ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use std::hash::Hash;

/// A step of a list of every object, which replaces what an index holds: it may go on answering
/// from what it had until [`Reset::Done`] (a list that fails half-way leaves it as it was).
#[derive(Debug)]
pub enum Reset<'a, K> {
    /// A list begins.
    Begin,
    /// One listed object.
    Listed(&'a K),
    /// The list is complete: what was not listed is gone.
    Done,
}

/// An index fed by a watch, one event at a time, in the watch's order.
pub trait Index<K>: Send + 'static {
    /// `object` was created or changed. Returns whether anything the index keeps of it changed
    /// (false: only what no reader reads, such as a new resourceVersion).
    fn apply(&mut self, object: &K) -> bool;
    /// `object` was deleted (as last seen).
    fn delete(&mut self, object: &K);
    /// A step of a list that replaces the whole index.
    fn reset(&mut self, step: Reset<'_, K>);
}

// By hand: derived, they would ask `K: Copy`, and a step only borrows its object.
impl<K> Clone for Reset<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Reset<'_, K> {}

/// Feeds `event` to `index`; returns what [`Index::apply`] returned for an update, true otherwise.
pub fn feed<K, I: Index<K> + ?Sized>(index: &mut I, event: &Event<K>) -> bool {
    match event {
        Event::Apply(object) => return index.apply(object),
        Event::Delete(object) => index.delete(object),
        Event::Init => index.reset(Reset::Begin),
        Event::InitApply(object) => index.reset(Reset::Listed(object)),
        Event::InitDone => index.reset(Reset::Done),
    }
    true
}

/// Nothing kept.
impl<K> Index<K> for () {
    fn apply(&mut self, _: &K) -> bool {
        false
    }
    fn delete(&mut self, _: &K) {}
    fn reset(&mut self, _: Reset<'_, K>) {}
}

/// Two indexes fed the same events, the first one first (it sees an event before the second
/// takes it: the second may be the cache the first reads the previous version from).
impl<K, A: Index<K>, B: Index<K>> Index<K> for (A, B) {
    fn apply(&mut self, object: &K) -> bool {
        let first = self.0.apply(object);
        self.1.apply(object) || first
    }

    fn delete(&mut self, object: &K) {
        self.0.delete(object);
        self.1.delete(object);
    }

    fn reset(&mut self, step: Reset<'_, K>) {
        self.0.reset(step);
        self.1.reset(step);
    }
}

/// kube's store. Its writer takes owned events: each object is copied once more, which is cheap
/// next to the store's own copy.
impl<K> Index<K> for Writer<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn apply(&mut self, object: &K) -> bool {
        self.apply_watcher_event(&Event::Apply(object.clone()));
        true
    }

    fn delete(&mut self, object: &K) {
        self.apply_watcher_event(&Event::Delete(object.clone()));
    }

    fn reset(&mut self, step: Reset<'_, K>) {
        self.apply_watcher_event(&match step {
            Reset::Begin => Event::Init,
            Reset::Listed(object) => Event::InitApply(object.clone()),
            Reset::Done => Event::InitDone,
        });
    }
}

/// A cache that answers the resourceVersion it holds of an object.
pub trait Versions: Clone + Send + Sync + 'static {
    /// The cached version of `namespace/name`; `None` when it is not cached.
    fn version(&self, namespace: &str, name: &str) -> Option<String>;
}

impl<K> Versions for Store<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    fn version(&self, namespace: &str, name: &str) -> Option<String> {
        let key = ObjectRef::new(name).within(namespace);
        self.get(&key)
            .map(|cached| cached.resource_version().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notes what it is fed into a shared log.
    struct Log(
        &'static str,
        std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        bool,
    );

    impl Index<u32> for Log {
        fn apply(&mut self, object: &u32) -> bool {
            self.1
                .lock()
                .unwrap()
                .push(format!("{} apply {object}", self.0));
            self.2
        }
        fn delete(&mut self, object: &u32) {
            self.1
                .lock()
                .unwrap()
                .push(format!("{} delete {object}", self.0));
        }
        fn reset(&mut self, step: Reset<'_, u32>) {
            let step = match step {
                Reset::Begin => "begin".to_string(),
                Reset::Listed(object) => format!("listed {object}"),
                Reset::Done => "done".to_string(),
            };
            self.1.lock().unwrap().push(format!("{} {step}", self.0));
        }
    }

    #[test]
    fn a_pair_feeds_its_first_index_first_and_changed_if_either_changed() {
        let log: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let mut pair = (Log("a", log.clone(), false), Log("b", log.clone(), false));
        assert!(!feed(&mut pair, &Event::Apply(1)), "neither changed");
        pair.1 .2 = true;
        assert!(feed(&mut pair, &Event::Apply(2)));
        (pair.0 .2, pair.1 .2) = (true, false);
        assert!(feed(&mut pair, &Event::Apply(3)));
        for event in [
            Event::Delete(4),
            Event::Init,
            Event::InitApply(5),
            Event::InitDone,
        ] {
            assert!(feed(&mut pair, &event), "not an update: always passed on");
        }
        let log = log.lock().unwrap().clone();
        let expected = [
            "a apply 1",
            "b apply 1",
            "a apply 2",
            "b apply 2",
            "a apply 3",
            "b apply 3",
            "a delete 4",
            "b delete 4",
            "a begin",
            "b begin",
            "a listed 5",
            "b listed 5",
            "a done",
            "b done",
        ];
        assert_eq!(log, expected);
    }
}
