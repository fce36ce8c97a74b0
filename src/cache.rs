//! The controllers' caches: the watch scope, cached watches, when the caches have listed, and
//! waiting for a write to reach them. Domain-free.

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;
use tokio::sync::watch;

/// How long a reconcile waits for its writes to reach the caches (see [`until_visible`]).
pub const WRITES_VISIBLE_WITHIN: Duration = Duration::from_secs(2);

/// Waits, at most `within`, until `store` holds the version of `key` a write answered with
/// (`written`) or a later one (one other than `before`, the version cached before the write).
///
/// Why: a reconcile's own writes trigger the next one at once, and the watch may deliver them a
/// few milliseconds later: read from a cache that has not caught up, the next reconcile would
/// write the same objects and Events again.
pub async fn until_visible<K>(
    store: &Store<K>,
    key: &reflector::ObjectRef<K>,
    before: Option<String>,
    written: Option<String>,
    within: Duration,
) where
    K: Resource + Clone,
    K::DynamicType: Eq + Hash + Clone,
{
    if within.is_zero() {
        return;
    }
    let caught_up = || {
        store.get(key).is_some_and(|cached| {
            let version = cached.resource_version();
            version == written || version != before
        })
    };
    let deadline = tokio::time::Instant::now() + within;
    while !caught_up() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
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

/// Annotation in which `kubectl apply` keeps a second copy of the whole object.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What a cache drops of every object: managedFields and kubectl's last-applied copy, never read
/// and often the largest part of an object.
pub fn strip<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
    obj.annotations_mut().remove(LAST_APPLIED);
}

/// A cached watch of `api`: the store, and the stream that fills it (to be polled by a
/// controller), each object [`strip`]ped before caching. `observe(event, cache)` sees each event
/// before the cache takes it, so the cache still holds the object's previous version.
pub fn cached<K, F>(
    api: Api<K>,
    config: watcher::Config,
    mut observe: F,
) -> (
    Store<K>,
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    F: FnMut(&watcher::Event<K>, &Store<K>) + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let cache = reader.clone();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(strip)
        .inspect(move |event| {
            if let Ok(event) = event {
                observe(event, &cache);
            }
        })
        .reflect(writer);
    (reader, stream)
}

/// A cache that tells when it has listed once, whatever it holds.
pub trait StoreReady: Send + Sync + 'static {
    fn listed(&self) -> futures::future::BoxFuture<'static, ()>;
}

impl<K> StoreReady for Store<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn listed(&self) -> futures::future::BoxFuture<'static, ()> {
        let store = self.clone();
        Box::pin(async move {
            let _ = store.wait_until_ready().await;
        })
    }
}

/// Whether a controller's caches have all listed once, for any number of waiters.
///
/// kube's `Store::wait_until_ready` wakes only the last task that polled it (a oneshot keeps one
/// waker), and kube's own controller polls it too: many reconciles waiting on it directly could
/// sleep forever. One task polls the stores again every 100 ms until they are ready, then this
/// gate releases every waiter.
#[derive(Clone)]
pub struct CachesReady {
    rx: watch::Receiver<bool>,
}

impl CachesReady {
    /// Open from the start (tests, caches filled by hand).
    pub fn already() -> Self {
        CachesReady {
            rx: watch::Sender::new(true).subscribe(),
        }
    }

    /// Opens once every one of `stores` has listed; must be called inside the tokio runtime.
    pub fn of(stores: Vec<Box<dyn StoreReady>>) -> Self {
        let tx = watch::Sender::new(false);
        let rx = tx.subscribe();
        tokio::spawn(async move {
            let all = || futures::future::join_all(stores.iter().map(|s| s.listed()));
            while tokio::time::timeout(Duration::from_millis(100), all())
                .await
                .is_err()
            {}
            tx.send_replace(true);
        });
        CachesReady { rx }
    }

    pub fn is_ready(&self) -> bool {
        *self.rx.borrow()
    }

    /// Waits until the caches have listed once.
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        // An error means the poller is gone without opening: the runtime is shutting down.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}
