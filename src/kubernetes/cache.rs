//! The controllers' caches: the watch scope, cached watches feeding their [`Index`]es, when the
//! caches have listed, and waiting for a write to reach them. Domain-free.

use super::arrivals::Arrivals;
use super::compact::Compact;
use super::index::{Index, Reset, Versions};
use super::records::Records;
use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a reconcile waits for its writes to reach the caches (see [`until_visible`]).
pub const WRITES_VISIBLE_WITHIN: Duration = Duration::from_secs(2);

/// Waits, at most `within`, until `cache` holds the version of `namespace/name` a write answered
/// with (`written`) or a later one (one other than `before`, the version cached before the write);
/// after a deletion (`written: None`), until the cache no longer holds it.
/// `arrivals` are those of `cache`: the watch filling it wakes this wait when that object changes.
///
/// Why: a reconcile's own writes trigger the next one at once, and the watch may deliver them a
/// few milliseconds later: read from a cache that has not caught up, the next reconcile would
/// write the same objects and Events again. Woken by the watch rather than polling: polling cost
/// a timer wake-up every 2 ms for each write awaited, more the slower the API server answers.
#[allow(clippy::too_many_arguments)]
pub async fn until_visible<C: Versions>(
    cache: &C,
    arrivals: &Arrivals,
    namespace: &str,
    name: &str,
    before: Option<String>,
    written: Option<String>,
    within: Duration,
) {
    if within.is_zero() {
        return;
    }
    // Watched before the first look, so an event between the look and the wait is not missed.
    let arrival = arrivals.watch(namespace, name);
    let caught_up = || match cache.version(namespace, name) {
        Some(version) => Some(&version) == written.as_ref() || Some(&version) != before.as_ref(),
        // `written: None` is a deletion: done once the object is gone from the cache.
        None => written.is_none(),
    };
    let _ = tokio::time::timeout(within, async {
        while !caught_up() {
            arrival.changed().await;
        }
    })
    .await;
}

/// Which namespaces the operator watches and writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (cluster-wide RBAC).
    #[default]
    All,
    /// One namespace (namespaced RBAC).
    Namespace(String),
}

impl Scope {
    /// An Api over the scope, for watches.
    pub fn api<K>(&self, client: Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Scope::All => Api::all(client),
            Scope::Namespace(ns) => Api::namespaced(client, ns),
        }
    }
}

/// An object a cache keeps, [`strip`]ped of the metadata its readers do not read.
pub trait Cached: Resource {
    /// Whether the cache's readers read the labels (they are dropped otherwise).
    const LABELS_READ: bool;
}

/// What a cache drops of every object: managedFields and the annotations (kubectl's
/// last-applied copy, Argo CD's tracking id: never read, often the largest part of an object),
/// and the labels unless read. Set to `None`, not emptied: an emptied list or map keeps its
/// allocation for as long as the object is cached.
pub fn strip<K: Cached>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    if !K::LABELS_READ {
        meta.labels = None;
    }
}

/// The watches of one controller: when they have all listed once ([`CachesReady`]) and when one
/// lists again ([`Relists`]). Cheap to clone: every clone is the same.
#[derive(Clone, Default)]
pub struct Watches {
    pub relists: Relists,
    pub ready: CachesReady,
}

impl Watches {
    /// A cached watch of `api`: kube's store, and the stream that fills it (to be polled by a
    /// controller), each object [`strip`]ped before caching. `index`, made with the store, is fed
    /// each event before the store takes it (it may read the object's previous version there).
    /// Every event that reached the store is told to `arrivals`.
    pub fn cached<K, I>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        arrivals: &Arrivals,
        index: impl FnOnce(&Store<K>) -> I,
    ) -> (
        Store<K>,
        impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    )
    where
        K: Cached + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        I: Index<K>,
    {
        let (reader, writer) = reflector::store();
        let events = watcher(api, config).default_backoff().modify(strip);
        let first_list = self.ready.expect();
        let stream = self.caching(events, arrivals, (index(&reader), writer), first_list);
        (reader, stream)
    }

    /// A cached watch of `api` kept as [`Records`], and the stream of the [`Compact`] objects that
    /// fills it, to be polled by a controller.
    pub fn cached_records<K>(
        &self,
        api: Api<Compact<K>>,
        config: watcher::Config,
    ) -> (
        Records,
        impl Stream<Item = Result<watcher::Event<Compact<K>>, watcher::Error>> + Send + 'static,
    )
    where
        K: Resource<DynamicType = ()> + Send + 'static,
    {
        let records = Records::default();
        let events = watcher(api, config).default_backoff();
        let first_list = self.ready.expect();
        let stream = self.caching(events, records.arrivals(), records.writer(), first_list);
        (records, stream)
    }

    /// [`Watches::cached_records`], the watch started only once [`OnDemand::want`] is called: a
    /// kind that few CdnClusters need costs nothing (a connection and its buffers) until one
    /// does. Its first list is awaited by [`OnDemand::listed`], not by [`Watches::ready`].
    pub fn cached_records_on_demand<K>(
        &self,
        api: Api<Compact<K>>,
        config: watcher::Config,
    ) -> (
        Records,
        OnDemand,
        impl Stream<Item = Result<watcher::Event<Compact<K>>, watcher::Error>> + Send + 'static,
    )
    where
        K: Resource<DynamicType = ()> + Send + 'static,
    {
        let records = Records::default();
        let on_demand = OnDemand {
            wanted: Arc::new(watch::Sender::new(false)),
            listed: CachesReady::default(),
        };
        let first_list = on_demand.listed.expect();
        let events =
            on_demand.started(move || watcher(api.clone(), config.clone()).default_backoff());
        let stream = self.caching(events, records.arrivals(), records.writer(), first_list);
        (records, on_demand, stream)
    }

    /// A watch of `api` feeding `index`, and the stream of the events that may call for a
    /// reconcile (an update the index says changed nothing it keeps is not passed on), to be
    /// polled by a controller. No reconcile waits on such an index for its writes.
    pub fn indexed<K, I>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        index: I,
    ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
        I: Index<K>,
    {
        let events = watcher(api, config).default_backoff();
        let first_list = self.ready.expect();
        self.caching(events, &Arrivals::default(), index, first_list)
    }

    /// Feeds `events` to `index`, and passes on those that may call for a reconcile.
    fn caching<K, I>(
        &self,
        events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
        arrivals: &Arrivals,
        mut index: I,
        first_list: FirstList,
    ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
    where
        K: Resource + Send + 'static,
        I: Index<K>,
    {
        let (relists, arrivals) = (self.relists.clone(), arrivals.clone());
        let mut first_list = Some(first_list);
        events
            // An update that changed nothing the index keeps (a Deployment's status conditions, a
            // field of another manager) would reconcile the owner for nothing: it is not passed
            // on. The objects of a re-list go to the indexes' buffers, which replace them only at
            // its end: a reconcile they triggered would read the world from before the watch lost
            // its place (and one for an object created meanwhile would find nothing and be
            // dropped). So they trigger nothing; at the end, with the indexes replaced, `relists`
            // has every object reconciled, which also covers what was deleted meanwhile.
            .filter(move |event| {
                let keep = match event {
                    Err(_) => true,
                    Ok(watcher::Event::Apply(object)) => {
                        let changed = index.apply(object);
                        arrivals.arrived(Some(object.meta()));
                        changed
                    }
                    Ok(watcher::Event::Delete(object)) => {
                        index.delete(object);
                        arrivals.arrived(Some(object.meta()));
                        true
                    }
                    Ok(watcher::Event::Init) => {
                        index.reset(Reset::Begin);
                        true
                    }
                    Ok(watcher::Event::InitApply(object)) => {
                        index.reset(Reset::Listed(object));
                        first_list.is_some()
                    }
                    Ok(watcher::Event::InitDone) => {
                        index.reset(Reset::Done);
                        arrivals.arrived(None);
                        match first_list.take() {
                            Some(listed) => listed.done(),
                            None => relists.tell(),
                        }
                        true
                    }
                };
                futures::future::ready(keep)
            })
    }
}

/// When a controller's caches list again after the first time: their watch lost its place (the
/// API server answered 410 Gone) and listed everything anew. Each controller reconciles every
/// object then ([`Relists::listed_again`]), with the caches fresh.
#[derive(Clone)]
pub struct Relists {
    tx: Arc<watch::Sender<()>>,
}

impl Default for Relists {
    fn default() -> Self {
        Relists {
            tx: Arc::new(watch::Sender::new(())),
        }
    }
}

impl Relists {
    fn tell(&self) {
        self.tx.send_replace(());
    }

    /// Yields once after each re-list that ends after this call (several in a row may yield once).
    pub fn listed_again(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        rx.mark_unchanged();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

/// Whether a controller's caches have all listed once, for any number of waiters: each cached
/// watch made by [`Watches`] holds it closed until its first list is complete. Told by the
/// watches themselves: kube's `Store::wait_until_ready` wakes only the last task that polled it.
#[derive(Clone)]
pub struct CachesReady {
    /// How many watches have not listed yet.
    pending: Arc<watch::Sender<usize>>,
}

impl Default for CachesReady {
    /// Open until a watch is made with it (tests, caches filled by hand).
    fn default() -> Self {
        CachesReady {
            pending: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl CachesReady {
    /// One more watch to wait for; it opens its part with [`FirstList::done`].
    fn expect(&self) -> FirstList {
        self.pending.send_modify(|pending| *pending += 1);
        FirstList {
            ready: self.clone(),
        }
    }

    pub fn is_ready(&self) -> bool {
        *self.pending.borrow() == 0
    }

    /// Waits until the caches have listed once.
    pub async fn wait(&self) {
        let mut rx = self.pending.subscribe();
        // Never an error: this holds the sender.
        let _ = rx.wait_for(|pending| *pending == 0).await;
    }
}

/// A watch made by [`Watches::cached_records_on_demand`]: started by the first [`OnDemand::want`].
/// Cheap to clone: every clone is the same. The default (caches filled by hand, in tests) is
/// wanted and listed.
#[derive(Clone)]
pub struct OnDemand {
    wanted: Arc<watch::Sender<bool>>,
    listed: CachesReady,
}

impl Default for OnDemand {
    fn default() -> Self {
        OnDemand {
            wanted: Arc::new(watch::Sender::new(true)),
            listed: CachesReady::default(),
        }
    }
}

impl OnDemand {
    /// Starts the watch, if it is not started.
    pub fn want(&self) {
        self.wanted
            .send_if_modified(|wanted| !std::mem::replace(wanted, true));
    }

    /// Whether the watch was started.
    pub fn is_wanted(&self) -> bool {
        *self.wanted.borrow()
    }

    /// Starts the watch if needed and waits until its cache has listed once.
    pub async fn listed(&self) {
        self.want();
        self.listed.wait().await;
    }

    /// The events of the watch that `start` makes once wanted; nothing before.
    fn started<S: Stream>(&self, mut start: impl FnMut() -> S) -> impl Stream<Item = S::Item> {
        let mut wanted = self.wanted.subscribe();
        futures::stream::once(async move {
            // Never an error: the OnDemand holds the sender.
            let _ = wanted.wait_for(|wanted| *wanted).await;
        })
        .flat_map(move |()| start())
    }
}

/// The first list of one watch, awaited by [`CachesReady`].
struct FirstList {
    ready: CachesReady,
}

impl FirstList {
    fn done(self) {
        self.ready.pending.send_modify(|pending| *pending -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use futures::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::controller::{Action, Controller};
    use kube::ResourceExt;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    type Seen = Arc<Mutex<Vec<(String, BTreeSet<String>)>>>;

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm
    }

    fn names(store: &Store<ConfigMap>) -> BTreeSet<String> {
        store.state().iter().map(|cm| cm.name_any()).collect()
    }

    async fn until(seen: &Seen, what: impl Fn(&[(String, BTreeSet<String>)]) -> bool) -> bool {
        for _ in 0..200 {
            if what(&seen.lock().unwrap()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// A CdnCluster as a real server returns it, with labels added.
    fn served_cluster() -> crate::api::CdnCluster {
        let mut cluster: crate::api::CdnCluster = serde_json::from_str(include_str!(
            "../../tests/fixtures/real-server/cdncluster-cache-live.json"
        ))
        .unwrap();
        cluster.metadata.labels = Some([("app".to_string(), "cdn".to_string())].into());
        cluster
    }

    #[test]
    fn a_cached_object_keeps_no_managed_fields_annotations_or_unread_labels() {
        let served = served_cluster();
        assert!(served.metadata.managed_fields.is_some() && served.metadata.annotations.is_some());
        let mut cluster = served.clone();
        strip(&mut cluster);
        // None, not empty: an emptied Vec or map would keep its allocation.
        assert_eq!(cluster.metadata.managed_fields, None);
        assert_eq!(cluster.metadata.annotations, None);
        assert_eq!(
            cluster.metadata.labels, None,
            "a CdnCluster's labels are not read"
        );
        assert_eq!(
            (&cluster.spec, &cluster.status, &cluster.metadata.uid),
            (&served.spec, &served.status, &served.metadata.uid),
            "the rest is kept"
        );
        assert_eq!(
            cluster.metadata,
            ObjectMeta {
                managed_fields: None,
                annotations: None,
                labels: None,
                ..served.metadata
            }
        );

        let mut pod = k8s_openapi::api::core::v1::Pod::default();
        pod.metadata.labels = Some([("app".to_string(), "at".to_string())].into());
        pod.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        strip(&mut pod);
        assert_eq!(
            (pod.metadata.labels.unwrap().len(), pod.metadata.annotations),
            (1, None),
            "a pod's labels are read: kept"
        );
    }

    fn versioned(name: &str, version: &str) -> ConfigMap {
        let mut cm = config_map(name);
        cm.metadata.resource_version = Some(version.into());
        cm
    }

    /// A reconcile waiting for its write to reach the cache is woken by the watch event that
    /// brings it, not by its deadline (time is paused: it would jump to the deadline at once).
    #[tokio::test(start_paused = true)]
    async fn a_wait_for_a_write_ends_when_the_watch_delivers_it() {
        let (watch, events) = mpsc::unbounded();
        let arrivals = Arrivals::default();
        let (store, writer) = reflector::store();
        let watches = Watches::default();
        let stream = watches.caching(events, &arrivals, writer, watches.ready.expect());
        tokio::spawn(stream.for_each(|_| async {}));
        let send = |event| watch.unbounded_send(Ok(event)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(versioned("a", "1")));
        send(watcher::Event::InitDone);
        store.wait_until_ready().await.unwrap();

        let within = Duration::from_secs(10);
        let start = tokio::time::Instant::now();
        let wait = tokio::spawn({
            let (store, arrivals) = (store.clone(), arrivals.clone());
            async move {
                let (before, written) = (Some("1".to_string()), Some("3".to_string()));
                until_visible(&store, &arrivals, "ns", "a", before, written, within).await;
                tokio::time::Instant::now()
            }
        });
        tokio::task::yield_now().await;
        assert_eq!(arrivals.len(), 1, "the wait is registered");
        // Another object changes: the wait goes on.
        send(watcher::Event::Apply(versioned("b", "2")));
        tokio::task::yield_now().await;
        assert!(!wait.is_finished());
        send(watcher::Event::Apply(versioned("a", "3")));
        let ended = wait.await.unwrap();
        assert!(
            ended - start < within,
            "woken by the event, {:?} after it began",
            ended - start
        );
        assert!(
            arrivals.is_empty(),
            "a finished wait is no longer registered"
        );

        // Nothing arrives: the wait ends at its deadline.
        let before = Some("3".to_string());
        until_visible(&store, &arrivals, "ns", "a", before, None, within).await;
        assert_eq!(tokio::time::Instant::now() - ended, within);
        assert!(arrivals.is_empty());
    }

    /// The caches of a controller are ready once every watch has listed once, and stay so
    /// through a re-list; until then every waiter waits.
    #[tokio::test]
    async fn the_caches_are_ready_once_every_watch_has_listed() {
        let watches = Watches::default();
        let (watch_a, events_a) = mpsc::unbounded();
        let (watch_b, events_b) = mpsc::unbounded();
        let a = watches.caching(events_a, &Arrivals::default(), (), watches.ready.expect());
        let b = watches.caching(events_b, &Arrivals::default(), (), watches.ready.expect());
        tokio::spawn(a.for_each(|_| async {}));
        tokio::spawn(b.for_each(|_| async {}));
        let ready = watches.ready.clone();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                tokio::spawn({
                    let ready = ready.clone();
                    async move { ready.wait().await }
                })
            })
            .collect();
        let send = |watch: &mpsc::UnboundedSender<_>, event: watcher::Event<ConfigMap>| {
            watch.unbounded_send(Ok(event)).unwrap()
        };
        send(&watch_a, watcher::Event::Init);
        send(&watch_a, watcher::Event::InitDone);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!ready.is_ready(), "b has not listed");
        assert!(waiters.iter().all(|w| !w.is_finished()));
        // A second list of a counts for nothing.
        send(&watch_a, watcher::Event::Init);
        send(&watch_a, watcher::Event::InitDone);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!ready.is_ready());
        send(&watch_b, watcher::Event::Init);
        send(&watch_b, watcher::Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(1), waiter)
                .await
                .expect("every waiter is released")
                .unwrap();
        }
        assert!(ready.is_ready());
        send(&watch_b, watcher::Event::Init);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ready.is_ready(), "a re-list does not close the caches");
    }

    /// A wait is woken by a change of its object, and by a list replacing the cache (which
    /// carries no event per object); not by a change of another object.
    #[tokio::test]
    async fn a_wait_is_woken_by_its_object_and_by_a_list_only() {
        let arrivals = Arrivals::default();
        let a = arrivals.watch("ns", "a");
        let other_namespace = arrivals.watch("other", "a");
        arrivals.arrived(Some(&versioned("b", "1").metadata));
        arrivals.arrived(Some(&versioned("a", "1").metadata));
        assert!(a.changed().now_or_never().is_some());
        assert!(
            a.changed().now_or_never().is_none(),
            "one wake-up per event"
        );
        assert!(other_namespace.changed().now_or_never().is_none());
        arrivals.arrived(None);
        assert!(a.changed().now_or_never().is_some());
        assert!(other_namespace.changed().now_or_never().is_some());
        assert_eq!(arrivals.len(), 2);
        drop(a);
        assert_eq!(arrivals.len(), 1);
    }

    /// Updates of a child that change nothing its record keeps reconcile nothing; any other
    /// change, and a deletion, does.
    #[tokio::test]
    async fn only_a_change_of_what_is_read_of_a_child_is_passed_on() {
        use crate::kubernetes::compact::Compact;
        use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let deployment = |version: &str, ready: i32, fields: serde_json::Value, condition: &str| {
            let mut d = Deployment::default();
            d.metadata.name = Some("d".into());
            d.metadata.namespace = Some("ns".into());
            d.metadata.resource_version = Some(version.into());
            d.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some(crate::kubernetes::record::FIELD_MANAGER.into()),
                operation: Some("Apply".into()),
                fields_v1: Some(FieldsV1(fields)),
                ..Default::default()
            }]);
            d.status = Some(DeploymentStatus {
                replicas: Some(1),
                ready_replicas: Some(ready),
                conditions: Some(vec![serde_json::from_value(serde_json::json!(
                    {"type": "Progressing", "status": "True", "reason": condition}
                ))
                .unwrap()]),
                ..Default::default()
            });
            watcher::Event::Apply(Compact::of(&d))
        };
        let spec = serde_json::json!({"f:spec": {"f:replicas": {}}});
        let (watch, events) = mpsc::unbounded();
        let records = Records::default();
        let watches = Watches::default();
        let first_list = watches.ready.expect();
        let passed = watches.caching(events, records.arrivals(), records.writer(), first_list);
        let send = |event| watch.unbounded_send(Ok(event)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitDone);
        send(deployment("1", 0, spec.clone(), "NewReplicaSetCreated"));
        // Only its conditions (not kept) changed.
        send(deployment("2", 0, spec.clone(), "ProgressDeadlineExceeded"));
        send(deployment("3", 1, spec.clone(), "ProgressDeadlineExceeded"));
        // Another manager took a field the operator applied.
        send(deployment(
            "4",
            1,
            serde_json::json!({"f:spec": {}}),
            "ProgressDeadlineExceeded",
        ));
        send(deployment(
            "5",
            1,
            serde_json::json!({"f:spec": {}}),
            "ProgressDeadlineExceeded",
        ));
        send(watcher::Event::Delete(Compact::of(&Deployment {
            metadata: ObjectMeta {
                name: Some("d".into()),
                namespace: Some("ns".into()),
                resource_version: Some("6".into()),
                ..Default::default()
            },
            ..Default::default()
        })));
        drop(watch);
        let versions: Vec<String> = passed
            .filter_map(|event| async move {
                match event.unwrap() {
                    watcher::Event::Apply(d) => Some(format!("apply {}", d.record.version)),
                    watcher::Event::Delete(d) => Some(format!("delete {}", d.record.version)),
                    _ => None,
                }
            })
            .collect()
            .await;
        assert_eq!(versions, ["apply 1", "apply 3", "apply 4", "delete 6"]);
        assert_eq!(records.get("ns", "d"), None, "the cache took every event");
    }

    /// A controller wired as the operator's are, on a watch that lists, loses its place and lists
    /// again, finding `b` created meanwhile. Read during the re-list, the cache would still lack
    /// `b`: a parent of `b` reconciled then would wait for it forever, and `b` itself would be
    /// dropped as not found.
    #[tokio::test]
    async fn after_a_relist_every_object_is_reconciled_on_the_new_cache_and_none_before() {
        let (watch, events) = mpsc::unbounded();
        let watches = Watches::default();
        let (store, writer) = reflector::store();
        let stream = watches.caching(events, &Arrivals::default(), writer, watches.ready.expect());
        let seen: Seen = Arc::default();
        let controller = Controller::for_stream(stream.applied_objects(), store.clone())
            .reconcile_all_on(watches.relists.listed_again());
        let reconcile = |cm: Arc<ConfigMap>, ctx: Arc<(Store<ConfigMap>, Seen)>| async move {
            let (store, seen) = &*ctx;
            seen.lock().unwrap().push((cm.name_any(), names(store)));
            Ok::<_, kube::Error>(Action::await_change())
        };
        let ctx = Arc::new((store.clone(), seen.clone()));
        let run = controller.run(reconcile, |_, _, _| Action::await_change(), ctx);
        let task = tokio::spawn(run.for_each(|_| async {}));

        let send = |event| watch.unbounded_send(Ok(event)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(config_map("a")));
        send(watcher::Event::InitDone);
        assert!(
            until(&seen, |s| s.len() == 1).await,
            "the first list reconciles a"
        );

        send(watcher::Event::Init);
        send(watcher::Event::InitApply(config_map("a")));
        send(watcher::Event::InitApply(config_map("b")));
        // Time for the controller to act on the re-listed objects, were it told of them.
        tokio::time::sleep(Duration::from_millis(200)).await;
        send(watcher::Event::InitDone);
        assert!(
            until(&seen, |s| s.iter().any(|(name, _)| name == "b")).await,
            "b, created while the watch was away, is reconciled: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let both = BTreeSet::from(["a".to_string(), "b".to_string()]);
        let mut seen = seen.lock().unwrap().clone();
        // The two reconciles after the re-list run in any order.
        seen[1..].sort();
        assert_eq!(
            seen,
            [
                ("a".to_string(), BTreeSet::from(["a".to_string()])),
                ("a".to_string(), both.clone()),
                ("b".to_string(), both),
            ],
            "each reconcile after the re-list read the new cache"
        );
        task.abort();
    }

    /// An on-demand watch makes no request until wanted; then its first list opens `listed`.
    #[tokio::test]
    async fn an_on_demand_watch_starts_when_wanted_and_is_listed_after_its_first_list() {
        let watches = Watches::default();
        let records = Records::default();
        let on_demand = OnDemand {
            wanted: Arc::new(watch::Sender::new(false)),
            listed: CachesReady::default(),
        };
        let first_list = on_demand.listed.expect();
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let events = on_demand.started({
            let started = started.clone();
            move || {
                started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                futures::stream::iter([
                    Ok(watcher::Event::Init),
                    Ok(watcher::Event::InitApply(Compact::of(&config_map("a")))),
                    Ok(watcher::Event::InitDone),
                ])
            }
        });
        let mut stream =
            Box::pin(watches.caching(events, records.arrivals(), records.writer(), first_list));
        assert!(stream.next().now_or_never().is_none(), "waits");
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(!on_demand.is_wanted());
        assert!(
            watches.ready.is_ready(),
            "the controller's caches do not wait for it"
        );
        assert!(!on_demand.listed.is_ready());

        on_demand.want();
        let listed = tokio::spawn({
            let on_demand = on_demand.clone();
            async move { on_demand.listed().await }
        });
        while let Some(event) = stream.next().await {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                break;
            }
        }
        listed.await.unwrap();
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(records.get("ns", "a").is_some());
    }
}
