//! What a failed request to the API server tells (in one line, its code and message, whether the
//! object or its namespace is gone) and the key that names its object in logs and backoff.
//! Domain-free, and a leaf: Events and the controllers' shared error policy both look down to it.

use kube::{Resource, ResourceExt};

/// A failed request in one line: the server's message and code, or the client's error.
pub fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

/// Whether the API server refused to create something in a namespace being deleted
/// (`NamespaceTerminating`: 403, "unable to create new content in namespace … because it is being
/// terminated").
pub fn is_namespace_terminating(error: &kube::Error) -> bool {
    let kube::Error::Api(status) = error else {
        return false;
    };
    status.code == 403
        && (status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
            || status.message.contains("because it is being terminated"))
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

/// The key of an object in logs and backoff: its kind too, as a controller's objects of two
/// kinds may share a name (an At named `x-pod` and the pod of the At `x`).
pub fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{} {}/{}",
        K::kind(&()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}
