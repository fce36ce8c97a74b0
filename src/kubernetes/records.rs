//! The compact caches of the objects the operator applies: per object, only its [`Record`]
//! (see [`super::compact`] for why), under one key string: ~0.2 KiB per object. Domain-free.

use super::arrivals::Arrivals;
use super::compact::Compact;
use super::index::{Index, Reset, Versions};
use super::record::Record;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Where an object is cached: `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key(Box<str>);

impl Key {
    pub fn new(namespace: &str, name: &str) -> Self {
        Key(format!("{namespace}/{name}").into())
    }

    fn of(metadata: &ObjectMeta) -> Self {
        Key::new(
            metadata.namespace.as_deref().unwrap_or_default(),
            metadata.name.as_deref().unwrap_or_default(),
        )
    }
}

/// A cache of [`Record`]s of one kind, filled by a watch of [`Compact`] objects through its
/// [`RecordsWriter`] (see [`super::cache::Watches::cached_records`]); cheap to clone, every clone
/// reads the same cache.
#[derive(Clone, Default)]
pub struct Records {
    objects: Arc<RwLock<HashMap<Key, Record>>>,
    arrivals: Arrivals,
}

impl Records {
    /// The record of `namespace/name`, if cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Record> {
        self.read().get(&Key::new(namespace, name)).cloned()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// The waits on this cache's objects, woken by the watch that fills it.
    pub fn arrivals(&self) -> &Arrivals {
        &self.arrivals
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The one writer of this cache.
    pub fn writer(&self) -> RecordsWriter {
        RecordsWriter {
            records: self.clone(),
            listing: None,
        }
    }

    /// Replaces what the cache holds with `objects`, as a watch's (re)list does.
    pub fn fill<K: Send + 'static>(&self, objects: impl IntoIterator<Item = Compact<K>>) {
        let mut writer = self.writer();
        Index::<Compact<K>>::reset(&mut writer, Reset::Begin);
        for object in objects {
            writer.reset(Reset::Listed(&object));
        }
        Index::<Compact<K>>::reset(&mut writer, Reset::Done);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Key, Record>> {
        self.objects
            .read()
            .expect("the cache lock is never poisoned")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Key, Record>> {
        self.objects
            .write()
            .expect("the cache lock is never poisoned")
    }
}

/// Fills [`Records`] from watch events.
pub struct RecordsWriter {
    records: Records,
    /// The objects of a (re)list so far: they replace the cache at its end, as in kube's store.
    listing: Option<HashMap<Key, Record>>,
}

impl<K: Send + 'static> Index<Compact<K>> for RecordsWriter {
    fn apply(&mut self, object: &Compact<K>) -> bool {
        let key = Key::of(&object.metadata);
        let old = self.records.write().insert(key, object.record.clone());
        // The record is all the operator reads of the object.
        old.is_none_or(|old| !object.record.same_but_version(&old))
    }

    fn delete(&mut self, object: &Compact<K>) {
        self.records.write().remove(&Key::of(&object.metadata));
    }

    fn reset(&mut self, step: Reset<'_, Compact<K>>) {
        match step {
            Reset::Begin => self.listing = Some(HashMap::new()),
            Reset::Listed(object) => {
                if let Some(listing) = &mut self.listing {
                    listing.insert(Key::of(&object.metadata), object.record.clone());
                }
            }
            Reset::Done => {
                if let Some(mut listed) = self.listing.take() {
                    listed.shrink_to_fit();
                    *self.records.write() = listed;
                }
            }
        }
    }
}

impl Versions for Records {
    fn version(&self, namespace: &str, name: &str) -> Option<String> {
        self.read()
            .get(&Key::new(namespace, name))
            .map(|record| record.version.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::index::feed;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::runtime::watcher;

    fn named(namespace: &str, name: &str, version: &str) -> Compact<Deployment> {
        let mut d = Deployment::default();
        d.metadata.name = Some(name.into());
        d.metadata.namespace = Some(namespace.into());
        d.metadata.resource_version = Some(version.into());
        Compact::of(&d)
    }

    #[test]
    fn records_follow_the_watch_and_a_relist_replaces_them_at_its_end() {
        let records = Records::default();
        let mut writer = records.writer();
        let mut write = |event: watcher::Event<Compact<Deployment>>| feed(&mut writer, &event);
        write(watcher::Event::Init);
        write(watcher::Event::InitApply(named("n", "a", "1")));
        assert!(records.is_empty(), "a list shows once it is complete");
        write(watcher::Event::InitDone);
        assert_eq!(records.version("n", "a").as_deref(), Some("1"));
        assert_eq!(records.get("n", "a").map(|r| r.version), Some("1".into()));
        assert_eq!(records.get("m", "a"), None, "keyed by namespace too");

        write(watcher::Event::Apply(named("n", "b", "2")));
        write(watcher::Event::Apply(named("n", "a", "3")));
        assert_eq!(records.version("n", "a").as_deref(), Some("3"));
        write(watcher::Event::Delete(named("n", "b", "4")));
        assert_eq!(records.get("n", "b"), None);

        // A re-list: the old records stay until it ends; then only the listed ones remain.
        write(watcher::Event::Init);
        write(watcher::Event::InitApply(named("n", "c", "5")));
        assert_eq!(records.len(), 1);
        assert!(records.get("n", "a").is_some());
        write(watcher::Event::InitDone);
        assert_eq!(
            records.get("n", "a"),
            None,
            "deleted while the watch was away"
        );
        assert_eq!(records.version("n", "c").as_deref(), Some("5"));
        assert_eq!(records.len(), 1);
    }
}
