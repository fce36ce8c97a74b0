//! What every controller shares: the common part of its context, what its errors tell, backoff
//! and the error policy. Domain-free.

pub mod conditions;

use crate::kubernetes::cache::CachesReady;
use crate::kubernetes::errors::{is_namespace_terminating, key};
use crate::kubernetes::events::Events;
use crate::kubernetes::restricted::RunAs;
use kube::runtime::controller::Action;
use kube::{Client, Resource};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The part of every controller's context that is not its caches.
pub struct Shared {
    pub client: Client,
    pub events: Events,
    pub backoff: Backoff,
    /// Open once every cache of the controller has listed: before that, an object missing from
    /// a cache may exist, and acting on its absence would announce what did not happen.
    pub ready: CachesReady,
    /// The user and groups pinned on the pods the controller creates (none by default).
    pub run_as: RunAs,
}

impl Shared {
    pub fn new(client: Client, events: Events, ready: CachesReady) -> Self {
        Shared {
            client,
            events,
            backoff: Backoff::default(),
            ready,
            run_as: RunAs::default(),
        }
    }

    /// A reconcile of `obj` succeeded: its next failure backs off from the start again.
    pub fn succeeded<K: Resource<DynamicType = ()>>(&self, obj: &K) {
        self.backoff.succeeded(&key(obj));
    }
}

/// A controller's context: its caches around the [`Shared`] part.
pub trait Context: Send + Sync + 'static {
    fn shared(&self) -> &Shared;
}

/// What the shared error policy reads of a controller's error: the request that failed. Each
/// controller has its own error enum, by step.
pub trait Failure: std::error::Error + Send + Sync + 'static {
    /// The failed request's error.
    fn request(&self) -> &kube::Error;

    /// Whether the request was refused because the object's namespace is being deleted: the
    /// object goes with it, so nothing is retried or announced.
    fn is_namespace_terminating(&self) -> bool {
        is_namespace_terminating(self.request())
    }
}

/// The error policy of every controller: logs what failed and retries the object after its
/// backoff.
pub fn error_policy<K, C, E>(obj: Arc<K>, error: &E, ctx: Arc<C>) -> Action
where
    K: Resource<DynamicType = ()>,
    C: Context,
    E: Failure,
{
    ctx.shared().backoff.retry(&key(obj.as_ref()), error)
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

    /// Records a failure of `key`, logs it, and retries after its backoff; an object whose
    /// namespace is being deleted is left to go with it, quietly.
    pub fn retry(&self, key: &str, error: &impl Failure) -> Action {
        if error.is_namespace_terminating() {
            self.succeeded(key);
            tracing::debug!(%key, "its namespace is being deleted: not retried");
            return Action::await_change();
        }
        let delay = self.failed(key);
        tracing::warn!(object = %key, retry_in = ?delay, "{key}: {error}; retried in {delay:?}");
        Action::requeue(delay)
    }
}
