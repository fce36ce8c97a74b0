//! The waits for an object to reach a cache ([`Arrivals`]), woken by the watch that fills it.
//! A leaf of its own: the caches ([`super::records`]) hold them and the watches
//! ([`super::cache`]) wake them, so neither has to import the other for them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The waits on the objects of one cache ([`super::cache::until_visible`]), woken by the watch
/// that fills it ([`super::cache::Watches::cached`], [`super::cache::Watches::cached_records`])
/// each time one of those objects changes, or when a list replaces the whole cache. Cheap to
/// clone: every clone is the same.
#[derive(Clone, Default)]
pub struct Arrivals {
    waiting: Arc<Mutex<Vec<Waiter>>>,
}

struct Waiter {
    namespace: String,
    name: String,
    wake: Arc<Notify>,
}

impl Arrivals {
    /// Starts watching `namespace/name`; stops when the returned [`Arrival`] is dropped.
    pub fn watch(&self, namespace: &str, name: &str) -> Arrival {
        let wake = Arc::new(Notify::new());
        self.lock().push(Waiter {
            namespace: namespace.to_string(),
            name: name.to_string(),
            wake: wake.clone(),
        });
        Arrival {
            arrivals: self.clone(),
            wake,
        }
    }

    /// The cache took an event of the object `meta`, or, with `None`, was replaced whole.
    pub(super) fn arrived(&self, meta: Option<&ObjectMeta>) {
        let waiting = self.lock();
        for waiter in waiting.iter() {
            let awaited = meta.is_none_or(|meta| {
                meta.name.as_deref() == Some(waiter.name.as_str())
                    && meta.namespace.as_deref().unwrap_or_default() == waiter.namespace
            });
            if awaited {
                waiter.wake.notify_one();
            }
        }
    }

    /// How many waits are under way.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        self.waiting
            .lock()
            .expect("the arrivals lock is never poisoned")
    }
}

/// A wait on one object of a cache, from [`Arrivals::watch`].
pub struct Arrival {
    arrivals: Arrivals,
    wake: Arc<Notify>,
}

impl Arrival {
    /// Returns once the object changed in the cache since the last call (or since the watch
    /// began, for the first).
    pub async fn changed(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.arrivals
            .lock()
            .retain(|waiter| !Arc::ptr_eq(&waiter.wake, &self.wake));
    }
}
