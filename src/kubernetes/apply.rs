//! The one write path: server-side apply with a stable field manager, skipped when the observed
//! object already holds what would be applied, so a steady state sends no write at all; the
//! delete of an object that must be created again; the release of a finalizer, which must
//! never create anything; and values written once, never replaced (the operator's purge key).

use super::record::{hash, Record, APPLIED_HASH_ANNOTATION, FIELD_MANAGER};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt::Debug;

fn params() -> PatchParams {
    // Forced: the operator is the authority on the fields it sets; a hand edit of one of them is
    // taken back, while fields other managers set alone are left to them.
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Why an object must be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// There is no such object.
    Created,
    /// What the operator applies changed since its last apply.
    Updated,
    /// Another manager changed or removed fields the operator applied: to take back.
    Restored,
}

/// Whether `desired` must be applied over `observed` (its cached copy), and why; stamps
/// `desired` with its applied hash. Nothing is needed when `observed` carries the same hash and
/// the operator still owns every field of `desired` (see [`super::fields`]). Values are never
/// compared: zero values the server drops, its defaults and normalizations, and the fields other
/// managers own cost no write.
pub fn change<K>(desired: &mut K, observed: Option<&Record>) -> Option<Change>
where
    K: Resource + Serialize,
{
    // Serialized once: the hash is of the object without its annotation, which is then added
    // to both the object and its JSON form for the ownership check.
    let mut value = to_value(&*desired);
    let hash = hash(&value);
    value["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = Value::String(hash.clone());
    desired
        .annotations_mut()
        .insert(APPLIED_HASH_ANNOTATION.to_string(), hash.clone());
    let Some(observed) = observed else {
        return Some(Change::Created);
    };
    if !observed.applied_hash_is(&hash) {
        return Some(Change::Updated);
    }
    let owned = observed.owned.as_ref();
    if owned.is_some_and(|owned| owned.covers(&value)) {
        None
    } else {
        Some(Change::Restored)
    }
}

/// Applies `desired` if [`change`] says it is needed. Returns why, with the server's answer read
/// as `R`: the object itself, or only what a cache reads of it
/// ([`crate::kubernetes::compact::Compact`]), which spares building the whole object to drop it.
pub async fn apply<K, R>(
    api: &Api<R>,
    mut desired: K,
    observed: Option<&Record>,
) -> kube::Result<Option<(Change, R)>>
where
    K: Resource + Serialize + Debug,
    R: Resource + DeserializeOwned + Clone + Debug,
{
    let Some(change) = change(&mut desired, observed) else {
        return Ok(None);
    };
    let applied = api
        .patch(&desired.name_any(), &params(), &Patch::Apply(&desired))
        .await?;
    Ok(Some((change, applied)))
}

/// Applies `desired` without looking at a cached copy (there is none, or it cannot be trusted).
pub async fn apply_always<K>(api: &Api<K>, desired: K) -> kube::Result<K>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let applied = apply(api, desired, None).await?;
    Ok(applied
        .expect("without a cached copy, apply always sends the request")
        .1)
}

/// Applies `status` to the status subresource of `object` unless its current status equals it.
/// The operator alone writes status, so equality is the test. The server's answer is read as `R`
/// (see [`apply`]).
pub async fn apply_status<K, R, S>(
    api: &Api<R>,
    object: &K,
    current: Option<&S>,
    status: &S,
) -> kube::Result<Option<R>>
where
    K: Resource<DynamicType = ()>,
    R: Resource + Clone + DeserializeOwned + Debug,
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

/// Deletes `name` if it is still at resourceVersion `version`, for an object the desired one
/// cannot be applied over (a field that cannot change once set): the apply that follows creates
/// it again. Returns whether it was still there.
pub async fn delete_at<K>(api: &Api<K>, name: &str, version: &str) -> kube::Result<bool>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some(version.to_string()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Removes `finalizer` from `object`, the one write that is not an apply nor a delete: an apply creates the
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

/// Writes `data` into the object `observed` unless it changed since it was read (its
/// resourceVersion is a precondition), for a value that must be set once and never replaced: a
/// key made by the first of several replicas. A merge patch, which never creates. Returns the
/// object written, or `None` when another writer came first (read it again) or it is gone.
pub async fn fill_once<K>(api: &Api<K>, observed: &K, data: Value) -> kube::Result<Option<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut patch = data;
    patch["metadata"]["resourceVersion"] = json!(observed.resource_version());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    match api
        .patch(&observed.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(None),
        Err(error) => Err(error),
    }
}

/// Creates `object` unless one of its name exists; `None` when one does (read it: another
/// writer came first).
pub async fn create_once<K>(api: &Api<K>, object: &K) -> kube::Result<Option<K>>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let params = kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..kube::api::PostParams::default()
    };
    match api.create(&params, object).await {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(error) => Err(error),
    }
}

fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("Kubernetes objects always serialize to JSON")
}
