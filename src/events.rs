//! Kubernetes Events: what a controller's pure status step decides to tell, and publishing it.
//! Domain-free.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

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
