//! A compact cached copy of an object the operator applies: its metadata, the fields the
//! operator's last apply still owns, and its status. Domain-free.
//!
//! Why: drift is told by ownership ([`crate::fields`]) and the applied hash, never by comparing
//! specs, and only a Deployment's status is read; k8s-openapi types hold every optional field
//! inline (a cached typed Deployment costs ~20 KiB), so the rest is dropped as it arrives.

use crate::fields::Owned;
use internment::ArcIntern;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// An object of kind `K` as cached.
pub struct Compact<K> {
    /// What the operator reads of it (see [`kept`]); what matters of managedFields is in `owned`.
    pub metadata: ObjectMeta,
    /// The fields of the operator's own apply (its managedFields entry for the main resource),
    /// `None` when it has none. Interned: children of one kind and shape own the same fields
    /// (fieldsV1 names fields and list keys, not values), so thousands share one copy.
    pub owned: Option<ArcIntern<Owned>>,
    /// The status as compact JSON, if any.
    status: Option<Box<str>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Compact<K> {
    /// The compact copy of `object`.
    pub fn of(object: &K) -> Self
    where
        K: Serialize,
    {
        serde_json::from_value(serde_json::to_value(object).expect("objects serialize"))
            .expect("a serialized object is a JSON map")
    }

    /// The cached object as `K`: metadata and status, no spec.
    pub fn typed(&self) -> Result<K, serde_json::Error>
    where
        K: DeserializeOwned + Resource<DynamicType = ()>,
    {
        serde_json::from_value(self.to_value())
    }

    fn to_value(&self) -> Value
    where
        K: Resource<DynamicType = ()>,
    {
        let mut value = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": self.metadata,
        });
        if let Some(status) = &self.status {
            value["status"] = serde_json::from_str(status).expect("the status is JSON we wrote");
        }
        value
    }
}

/// The fields the manager `cdn-operator` applied to the main resource, from managedFields.
fn operator_fields(metadata: &ObjectMeta) -> Option<ArcIntern<Owned>> {
    metadata
        .managed_fields
        .as_ref()?
        .iter()
        .find(|entry| {
            entry.manager.as_deref() == Some(crate::apply::FIELD_MANAGER)
                && entry.operation.as_deref() == Some("Apply")
                && entry.subresource.as_deref().unwrap_or_default().is_empty()
        })
        .and_then(|entry| entry.fields_v1.as_ref())
        .map(|fields| ArcIntern::new(Owned::of(&fields.0)))
}

/// The metadata the operator reads of a cached child: its key and version (the cache, waiting
/// for a write), its generation (is the status current), its controller (which CdnCluster to
/// reconcile when it changes) and the applied hash (is it what the operator would apply). The
/// rest (labels, uid, timestamps, other annotations) is dropped: with thousands of children it
/// is most of the cache.
fn kept(metadata: ObjectMeta) -> ObjectMeta {
    let applied_hash = metadata
        .annotations
        .and_then(|mut all| all.remove_entry(crate::apply::APPLIED_HASH_ANNOTATION));
    ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        resource_version: metadata.resource_version,
        generation: metadata.generation,
        deletion_timestamp: metadata.deletion_timestamp,
        owner_references: metadata.owner_references.map(|refs| {
            refs.into_iter()
                .filter(|r| r.controller == Some(true))
                .collect()
        }),
        annotations: applied_hash.map(|entry| [entry].into()),
        ..ObjectMeta::default()
    }
}

impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Parts {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            status: Option<Value>,
        }
        let Parts { metadata, status } = Parts::deserialize(deserializer)?;
        let owned = operator_fields(&metadata);
        let status = status
            .filter(|s| !s.is_null())
            .map(|s| serde_json::to_string(&s).map(String::into_boxed_str))
            .transpose()
            .map_err(D::Error::custom)?;
        Ok(Compact {
            metadata: kept(metadata),
            owned,
            status,
            kind: PhantomData,
        })
    }
}

impl<K: Resource<DynamicType = ()>> Serialize for Compact<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Compact {
            metadata: self.metadata.clone(),
            owned: self.owned.clone(),
            status: self.status.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compact")
            .field("metadata", &self.metadata)
            .field("owned", &self.owned.is_some())
            .field("status", &self.status)
            .finish()
    }
}

impl<K: Resource> Resource for Compact<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        FieldsV1, ManagedFieldsEntry, OwnerReference,
    };
    use serde_json::json;

    fn entry(manager: &str, subresource: Option<&str>, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            subresource: subresource.map(Into::into),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn keeps_metadata_status_and_the_operators_fields_only() {
        let mut d = Deployment::default();
        d.metadata.name = Some("a".into());
        d.metadata.generation = Some(3);
        d.metadata.managed_fields = Some(vec![
            entry("kubectl", None, json!({"f:spec": {"f:paused": {}}})),
            entry(
                crate::apply::FIELD_MANAGER,
                Some("status"),
                json!({"f:status": {}}),
            ),
            entry(
                crate::apply::FIELD_MANAGER,
                None,
                json!({"f:spec": {"f:replicas": {}}}),
            ),
        ]);
        d.spec = Some(DeploymentSpec {
            replicas: Some(2),
            ..DeploymentSpec::default()
        });
        d.status = Some(DeploymentStatus {
            ready_replicas: Some(2),
            ..DeploymentStatus::default()
        });
        d.metadata.labels = Some([("app".to_string(), "a".to_string())].into());
        d.metadata.annotations = Some(
            [
                (crate::apply::APPLIED_HASH_ANNOTATION, "h1"),
                ("deployment.kubernetes.io/revision", "4"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        );
        d.metadata.uid = Some("uid-a".into());
        let owner = |name: &str, controller| OwnerReference {
            api_version: "cluster.anevia.com/v1".into(),
            kind: "CdnCluster".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        d.metadata.owner_references = Some(vec![owner("other", false), owner("lb", true)]);
        let compact = Compact::of(&d);
        assert_eq!(compact.metadata.name.as_deref(), Some("a"));
        assert_eq!(compact.metadata.managed_fields, None);
        assert_eq!(compact.metadata.labels, None, "labels are not read");
        assert_eq!(compact.metadata.uid, None, "nor is the uid");
        assert_eq!(
            compact.metadata.annotations,
            Some(
                [(
                    crate::apply::APPLIED_HASH_ANNOTATION.to_string(),
                    "h1".to_string()
                )]
                .into()
            ),
            "the applied hash is the only annotation read"
        );
        assert_eq!(
            compact.metadata.owner_references,
            Some(vec![owner("lb", true)]),
            "the controller routes a change to its CdnCluster"
        );
        let owned = compact.owned.as_ref().expect("the operator's apply entry");
        assert!(owned.covers(&json!({"spec": {"replicas": 1}})));
        assert!(!owned.covers(&json!({"spec": {"paused": true}})));

        let typed = compact.typed().unwrap();
        assert_eq!(typed.status.unwrap().ready_replicas, Some(2));
        assert_eq!(typed.metadata.generation, Some(3));
        assert_eq!(typed.spec, None, "the spec is not kept");
    }

    #[test]
    fn children_of_one_shape_share_their_owned_fields() {
        let child = |name: &str, paths: Value| {
            let mut d = Deployment::default();
            d.metadata.name = Some(name.into());
            d.metadata.managed_fields = Some(vec![entry(crate::apply::FIELD_MANAGER, None, paths)]);
            Compact::of(&d)
        };
        let shape = json!({"f:spec": {"f:replicas": {}}});
        let (a, b) = (child("a", shape.clone()), child("b", shape));
        let c = child("c", json!({"f:spec": {"f:paused": {}}}));
        let owned = |c: &Compact<Deployment>| c.owned.clone().unwrap();
        assert!(std::ptr::eq(&*owned(&a), &*owned(&b)), "one copy");
        assert!(!std::ptr::eq(&*owned(&a), &*owned(&c)));
    }

    #[test]
    fn an_object_the_operator_never_applied_owns_nothing() {
        let mut d = Deployment::default();
        d.metadata.managed_fields = Some(vec![entry("kubectl", None, json!({"f:spec": {}}))]);
        assert!(Compact::of(&d).owned.is_none());
    }
}
