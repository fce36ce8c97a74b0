//! The one write path: server-side apply with a stable field manager, skipped when the observed
//! object already holds what would be applied, so a steady state sends no write at all; and the
//! release of a finalizer, which must never create anything.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt::Debug;

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "cdn-operator";

fn params() -> PatchParams {
    // Forced: the operator is the authority on the fields it sets; a hand edit of one of them is
    // taken back, while fields other managers set alone are left to them.
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Annotation holding a hash of what the operator last applied to an object. A field dropped from
/// the desired object changes the hash, which the field-by-field comparison alone cannot see.
pub const APPLIED_HASH_ANNOTATION: &str = "cdn-operator.anevia.com/applied-hash";

/// Applies `desired` unless `observed` (the cached object, typed or [`Compact`]) already contains
/// every field of it. Returns the object the server answered with, or `None` when no request
/// was needed.
///
/// [`Compact`]: crate::compact::Compact
pub async fn apply<K, O>(
    api: &Api<K>,
    mut desired: K,
    observed: Option<&O>,
) -> kube::Result<Option<K>>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
    O: Serialize,
{
    let mut value = to_value(&desired);
    let hash = hash(&value);
    value["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = Value::String(hash.clone());
    desired
        .annotations_mut()
        .insert(APPLIED_HASH_ANNOTATION.to_string(), hash);
    if observed.is_some_and(|observed| contains(&to_value(observed), &value)) {
        return Ok(None);
    }
    let applied = api
        .patch(&desired.name_any(), &params(), &Patch::Apply(&desired))
        .await?;
    Ok(Some(applied))
}

/// Applies `desired` without looking at a cached copy (there is none, or it cannot be trusted).
pub async fn apply_always<K>(api: &Api<K>, desired: K) -> kube::Result<K>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let applied = apply(api, desired, None::<&K>).await?;
    Ok(applied.expect("without a cached copy, apply always sends the request"))
}

/// Applies `status` to the status subresource of `object` unless its current status equals it.
/// The operator alone writes status, so equality is the test.
pub async fn apply_status<K, S>(
    api: &Api<K>,
    object: &K,
    current: Option<&S>,
    status: &S,
) -> kube::Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(None);
    }
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": to_value(status),
    });
    let applied = api
        .patch_status(&object.name_any(), &params(), &Patch::Apply(&patch))
        .await?;
    Ok(Some(applied))
}

/// Removes `finalizer` from `object`, the one write that is not an apply: an apply creates the
/// object when it is missing, so releasing a finalizer from a stale cached copy could bring an
/// object back after it was deleted. This merge patch never creates, and carries the cached
/// resourceVersion as a precondition (a conflict, retried, when the object changed since).
/// Returns whether the object was still there.
pub async fn remove_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> kube::Result<bool>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if !object.finalizers().iter().any(|f| f == finalizer) {
        return Ok(true);
    }
    let kept: Vec<&String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .collect();
    let patch = json!({
        "metadata": {
            "resourceVersion": object.resource_version(),
            "finalizers": kept,
        }
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    match api
        .patch(&object.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// A short, stable digest of a JSON value (serde_json writes map keys in order).
pub fn hash(value: &Value) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(value.to_string().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("Kubernetes objects always serialize to JSON")
}

/// Whether `observed` holds every field of `desired` with the same value. Fields only in
/// `observed` (server defaults, other managers' fields, status) do not matter. Lists of objects
/// with a `name` are matched by name, as the API server merges them; other lists must be equal in
/// length and match element by element. Quantities are compared by value, as the server
/// normalizes them (`0.5` becomes `500m`). A long string of a compact cached copy is its digest.
pub fn contains(observed: &Value, desired: &Value) -> bool {
    match (observed, desired) {
        (_, Value::Null) => true,
        (Value::Object(o), Value::Object(d)) => d.iter().all(|(key, dv)| match o.get(key) {
            Some(ov) => contains(ov, dv),
            None => is_empty(dv),
        }),
        (Value::Array(o), Value::Array(d)) => {
            if d.iter().all(named) && o.iter().all(named) {
                d.iter().all(|dv| {
                    o.iter()
                        .find(|ov| ov.get("name") == dv.get("name"))
                        .is_some_and(|ov| contains(ov, dv))
                })
            } else {
                o.len() == d.len() && o.iter().zip(d).all(|(ov, dv)| contains(ov, dv))
            }
        }
        (Value::String(o), Value::String(d)) => {
            o == d || quantity_eq(o, d) || crate::compact::same_string(o, d)
        }
        (o, d) => o == d,
    }
}

fn named(value: &Value) -> bool {
    value.get("name").is_some_and(Value::is_string)
}

/// An empty map or list in `desired` is what the server drops: it matches a missing field.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

/// Equality of two Kubernetes quantities written differently (`1Gi` and `1024Mi`, `0.5` and `500m`).
fn quantity_eq(a: &str, b: &str) -> bool {
    match (quantity(a), quantity(b)) {
        (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()),
        _ => false,
    }
}

fn quantity(s: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 14] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (number, factor) = SUFFIXES
        .iter()
        .find_map(|(suffix, f)| s.strip_suffix(suffix).map(|n| (n, *f)))
        .unwrap_or((s, 1.0));
    // Only plain decimals: this must never call two different words equal.
    if number.is_empty()
        || !number
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == '-' || c == '+')
    {
        return None;
    }
    number.parse::<f64>().ok().map(|n| n * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_defaults_and_foreign_fields_do_not_count() {
        let observed = json!({"metadata": {"name": "a", "uid": "1", "labels": {"x": "1", "y": "2"}},
            "spec": {"replicas": 1, "revisionHistoryLimit": 10}});
        let desired =
            json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"replicas": 1}});
        assert!(contains(&observed, &desired));
    }

    #[test]
    fn a_changed_or_missing_field_counts() {
        let observed = json!({"spec": {"replicas": 2}});
        assert!(!contains(&observed, &json!({"spec": {"replicas": 1}})));
        assert!(!contains(&observed, &json!({"spec": {"paused": true}})));
        assert!(!contains(&json!({}), &json!({"data": {"a": "b"}})));
    }

    #[test]
    fn named_lists_match_by_name_and_tolerate_extra_entries() {
        let observed = json!({"containers": [
            {"name": "sidecar", "image": "s"},
            {"name": "nginx", "image": "n", "terminationMessagePath": "/dev/termination-log"}]});
        assert!(contains(
            &observed,
            &json!({"containers": [{"name": "nginx", "image": "n"}]})
        ));
        assert!(!contains(
            &observed,
            &json!({"containers": [{"name": "nginx", "image": "m"}]})
        ));
        assert!(!contains(
            &observed,
            &json!({"containers": [{"name": "other", "image": "n"}]})
        ));
    }

    #[test]
    fn plain_lists_must_match_in_length_and_order() {
        let observed = json!({"args": ["a", "b"]});
        assert!(contains(&observed, &json!({"args": ["a", "b"]})));
        assert!(!contains(&observed, &json!({"args": ["b", "a"]})));
        assert!(!contains(&observed, &json!({"args": ["a"]})));
    }

    #[test]
    fn quantities_compare_by_value() {
        assert!(contains(&json!({"cpu": "500m"}), &json!({"cpu": "0.5"})));
        assert!(contains(
            &json!({"memory": "1Gi"}),
            &json!({"memory": "1024Mi"})
        ));
        assert!(!contains(
            &json!({"memory": "1Gi"}),
            &json!({"memory": "1G"})
        ));
        assert!(!contains(&json!({"name": "m"}), &json!({"name": "n"})));
        assert!(!contains(&json!({"name": "1m"}), &json!({"name": "1M"})));
    }

    #[test]
    fn empty_desired_collections_match_absent_ones() {
        assert!(contains(
            &json!({"metadata": {}}),
            &json!({"metadata": {"annotations": {}}})
        ));
        assert!(!contains(
            &json!({"sources": ["a"]}),
            &json!({"sources": []})
        ));
    }
}
