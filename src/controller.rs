//! What every controller shares: the watch scope, cached watches, Events, error backoff and the
//! leadership gate. Domain-free.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Errors of a reconcile, by the step that failed. Each retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("could not apply {kind} {name}: {}", describe(source))]
    ApplyChild {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("could not write the status: {}", describe(.0))]
    WriteStatus(#[source] kube::Error),
    #[error("could not read the object afresh before writing: {}", describe(.0))]
    ReadFresh(#[source] kube::Error),
    #[error("could not release the finalizer of Pod {pod}: {}", describe(source))]
    ReleaseFinalizer {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

/// A failed request in one line: the server's message and code, or the client's error.
fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

/// Whether the API server answered that the object does not exist (any more).
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// The HTTP status code and message of a failed request, as the API server gave them.
pub fn refusal(error: &kube::Error) -> (Option<u16>, String) {
    match error {
        kube::Error::Api(status) => (Some(status.code), status.message.clone()),
        other => (None, other.to_string()),
    }
}

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

/// A cached watch of `api`: the store, and the stream that fills it (to be polled by a
/// controller). managedFields and kubectl's last-applied copy are dropped before caching: the
/// operator never reads them and they are often the largest part of an object.
pub fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    cached_observing(api, config, |_, _| {})
}

/// [`cached`], calling `observe(event, cache)` with each event before the cache takes it, so the
/// cache still holds the object's previous version to compare with.
pub fn cached_observing<K, F>(
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
        .modify(|obj: &mut K| {
            obj.managed_fields_mut().clear();
            obj.annotations_mut().remove(LAST_APPLIED);
        })
        .inspect(move |event| {
            if let Ok(event) = event {
                observe(event, &cache);
            }
        })
        .reflect(writer);
    (reader, stream)
}

/// An Event to publish about an object, decided by a controller's pure status step.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
    /// The child the Event is about, if any. Events are aggregated by reason and objects, so two
    /// children restored at once must name their child to stay two Events.
    pub related: Option<ObjectReference>,
}

impl Notice {
    pub fn normal(reason: &'static str, message: String) -> Self {
        Notice {
            warning: false,
            reason,
            message,
            related: None,
        }
    }

    pub fn warning(reason: &'static str, message: String) -> Self {
        Notice {
            warning: true,
            ..Notice::normal(reason, message)
        }
    }

    /// The same Event, about `child`.
    pub fn about(self, child: ObjectReference) -> Self {
        Notice {
            related: Some(child),
            ..self
        }
    }
}

/// The reporting controller of every Event the operator publishes (`kubectl get events` SOURCE).
pub const EVENT_REPORTER: &str = "cdn-operator";

/// Publishes Events for objects of one controller.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: EVENT_REPORTER.into(),
            instance,
        };
        Events {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publishes `notice` about `obj`. A failure to publish is logged, never fatal: Events are
    /// informative and the reconcile must not fail because of them.
    pub async fn publish<K>(&self, obj: &K, notice: Notice)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_: if notice.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: notice.reason.into(),
            note: Some(notice.message),
            action: "Reconcile".into(),
            secondary: notice.related,
        };
        if let Err(error) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!(%error, reason = notice.reason, "could not publish an Event");
        }
    }
}

/// Exponential backoff per object, reset by a success: 1 s, 2 s, 4 s ... up to 5 minutes.
#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub const MAX: Duration = Duration::from_secs(300);

    /// Records a failure of `key` and returns how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().expect("backoff lock");
        let n = failures.entry(key.to_string()).or_insert(0);
        let delay = Duration::from_secs(1u64 << (*n).min(9)).min(Self::MAX);
        *n = n.saturating_add(1);
        delay
    }

    pub fn succeeded(&self, key: &str) {
        self.failures.lock().expect("backoff lock").remove(key);
    }

    /// The error policy of every controller: logs what failed and retries `key` after its
    /// backoff.
    pub fn retry(&self, key: &str, error: &Error) -> Action {
        let delay = self.failed(key);
        tracing::warn!(%key, %error, retry_in = ?delay, "reconcile failed");
        Action::requeue(delay)
    }
}

/// The key of an object in logs and backoff.
pub fn key<K: Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Whether this replica may write. Standby replicas keep their caches warm and reconcile nothing:
/// the runtime calls no reconcile on them (`runtime::instrument::Reconciles`), and each acquisition
/// of leadership triggers a full reconcile (`acquired`, given to each controller).
#[derive(Clone)]
pub struct Leadership {
    tx: Arc<watch::Sender<bool>>,
}

impl Leadership {
    /// Starts as a standby until `set(true)`.
    pub fn standby() -> Self {
        Leadership {
            tx: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Always the leader: no election (local runs, tests).
    pub fn always() -> Self {
        Leadership {
            tx: Arc::new(watch::Sender::new(true)),
        }
    }

    pub fn set(&self, leader: bool) {
        self.tx.send_replace(leader);
    }

    pub fn is_leader(&self) -> bool {
        *self.tx.borrow()
    }

    /// Yields once each time leadership is acquired after this call.
    pub fn acquired(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        rx.mark_unchanged();
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                if *rx.borrow_and_update() {
                    return Some(((), rx));
                }
            }
        })
    }
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
