//! Kubernetes Events: what a controller's pure status step decides to tell, and publishing it.
//! Domain-free.

use super::errors;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::{Client, Resource};
use serde_json::json;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// How long a repeat of an Event counts in its series instead of making a new one (kube's
/// Recorder and client-go use six minutes too).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// Publishes Events as kube's `Recorder` does: events.k8s.io/v1 Events named
/// `<object>.<nanoseconds in hex>`, and a repeat within [`SERIES_WINDOW`] counted in the first
/// one's series (a merge patch). What it remembers of each Event is its key's hash, name and
/// count. Why not kube's: it keeps every Event whole for six minutes and scans them all on each
/// publish; creating 10,000 CdnClusters (an Event each) cost tens of MiB and CPU quadratic in
/// the number of objects.
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
    published: Arc<Mutex<Published>>,
}

/// What was published within the window, by the hash of what makes a repeat.
#[derive(Default)]
struct Published {
    series: HashMap<u64, Series>,
    pruned: Option<Instant>,
}

struct Series {
    name: Box<str>,
    count: i32,
    last: Instant,
}

impl Published {
    /// The series a publish of `key` at `now` continues: its Event's name and next count.
    fn repeat(&mut self, key: u64, now: Instant) -> Option<(Box<str>, i32)> {
        self.prune(now);
        self.series
            .get(&key)
            .filter(|s| now.duration_since(s.last) < SERIES_WINDOW)
            .map(|s| (s.name.clone(), s.count + 1))
    }

    /// Notes that the Event `name` of `key` was published at `now`, the `count`th time.
    fn published(&mut self, key: u64, name: Box<str>, count: i32, now: Instant) {
        self.series.insert(
            key,
            Series {
                name,
                count,
                last: now,
            },
        );
    }

    /// Forgets the series that ended more than a window ago; at most once a minute, so a
    /// publish costs the same with 10 or 10,000 objects.
    fn prune(&mut self, now: Instant) {
        if self
            .pruned
            .is_some_and(|at| now.duration_since(at) < Duration::from_secs(60))
        {
            return;
        }
        self.series
            .retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
        self.series.shrink_to_fit();
        self.pruned = Some(now);
    }
}

impl Events {
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: EVENT_REPORTER.into(),
            instance,
        };
        Events {
            client,
            reporter,
            published: Arc::default(),
        }
    }

    /// Publishes `notice` about `obj`. A failure to publish is logged, never fatal: Events are
    /// informative and the reconcile must not fail because of them.
    pub async fn publish<K>(&self, obj: &K, notice: Notice)
    where
        K: Resource<DynamicType = ()>,
    {
        let reason = notice.reason;
        match self.send(&obj.object_ref(&()), notice).await {
            Ok(()) => {}
            // The namespace is being deleted, and the object with it.
            Err(error) if errors::is_namespace_terminating(&error) => {
                tracing::debug!(reason, "no Event: its namespace is being deleted");
            }
            Err(error) => {
                let error = errors::describe(&error);
                let object = errors::key(obj);
                tracing::warn!(%object, reason, %error, "could not publish an Event; the reconcile goes on");
            }
        }
    }

    async fn send(&self, regarding: &ObjectReference, notice: Notice) -> kube::Result<()> {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let key = self.key(regarding, &notice);
        let now = Instant::now();
        let repeat = self.published().repeat(key, now);
        let (name, count) = match repeat {
            Some((name, count)) => {
                let patch = json!({
                    "reason": notice.reason,
                    "series": {"count": count, "lastObservedTime": MicroTime(Timestamp::now())},
                });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                (name, count)
            }
            None => {
                let event = self.event(regarding, notice);
                let name = event.metadata.name.clone().unwrap_or_default();
                api.create(&PostParams::default(), &event).await?;
                (name.into(), 1)
            }
        };
        self.published().published(key, name, count, now);
        Ok(())
    }

    fn published(&self) -> std::sync::MutexGuard<'_, Published> {
        self.published.lock().expect("never poisoned")
    }

    /// What makes a repeat: the same kind, reason and note about the same objects.
    fn key(&self, regarding: &ObjectReference, notice: &Notice) -> u64 {
        let mut hasher = DefaultHasher::new();
        let reference = |r: &ObjectReference, hasher: &mut DefaultHasher| {
            (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid).hash(hasher)
        };
        reference(regarding, &mut hasher);
        if let Some(related) = &notice.related {
            reference(related, &mut hasher);
        }
        (notice.warning, notice.reason, &notice.message).hash(&mut hasher);
        hasher.finish()
    }

    /// The Event kube's `Recorder` would create.
    fn event(&self, regarding: &ObjectReference, notice: Notice) -> Event {
        let now = Timestamp::now();
        let controller = &self.reporter.controller;
        Event {
            action: Some("Reconcile".into()),
            reason: Some(notice.reason.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: Some(notice.message),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_ref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(if notice.warning { "Warning" } else { "Normal" }.into()),
            related: notice.related,
            ..Event::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_continues_its_series_within_the_window_and_starts_a_new_one_after() {
        let start = Instant::now();
        let mut published = Published::default();
        assert_eq!(
            published.repeat(1, start),
            None,
            "a first publish is a new Event"
        );
        published.published(1, "lb.1".into(), 1, start);

        let soon = start + Duration::from_secs(60);
        assert_eq!(published.repeat(1, soon), Some(("lb.1".into(), 2)));
        assert_eq!(
            published.repeat(2, soon),
            None,
            "another key is another Event"
        );
        published.published(1, "lb.1".into(), 2, soon);

        // Counted from the last repeat: the series is still open 5 minutes after it.
        let later = soon + Duration::from_secs(5 * 60);
        assert_eq!(published.repeat(1, later), Some(("lb.1".into(), 3)));

        // Past the window: a new Event, whose own series starts at 1 under its own name.
        let past = soon + SERIES_WINDOW;
        assert_eq!(published.repeat(1, past), None);
        assert!(published.series.is_empty(), "the ended series is forgotten");
        published.published(1, "lb.2".into(), 1, past);
        let next = past + Duration::from_secs(1);
        assert_eq!(published.repeat(1, next), Some(("lb.2".into(), 2)));

        // Ended but not forgotten yet (the last prune was under a minute ago): not continued.
        let t0 = Instant::now();
        let mut published = Published::default();
        published.published(7, "a.1".into(), 1, t0);
        assert_eq!(published.repeat(8, t0 + Duration::from_secs(330)), None);
        let ended = t0 + Duration::from_secs(370);
        assert_eq!(published.repeat(7, ended), None);
        published.published(7, "a.2".into(), 1, ended);
        let after = ended + Duration::from_secs(1);
        assert_eq!(published.repeat(7, after), Some(("a.2".into(), 2)));
    }
}
