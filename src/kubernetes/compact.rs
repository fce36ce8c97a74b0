//! An object as the caches read it: straight from the watch's bytes, the metadata a controller
//! routes by and the object's [`Record`], nothing else built. Domain-free.
//!
//! Why: drift is told by ownership ([`super::fields`]) and the applied hash, never by comparing
//! specs, and only a Deployment's rollout counts are read; k8s-openapi types hold every optional
//! field inline (a cached typed Deployment costs ~20 KiB, an `ObjectMeta` alone ~0.4 KiB before
//! its strings), and kube's store keys each object with two more strings. So a watch event is
//! read into a [`Compact`], and the cache ([`super::records::Records`]) keeps the record alone.

use super::fields::{Owned, Text};
use super::record::{parse_hash, Record, Rollout, APPLIED_HASH_ANNOTATION, FIELD_MANAGER};
use internment::ArcIntern;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::num::{NonZeroI64, NonZeroU64};

/// An object of kind `K` as a watch delivers it to the cache, or as the server answers a write:
/// the metadata a controller routes by (name, namespace, uid, version, controller owner) and its
/// [`Record`]. Transient: [`super::records::Records`] keeps the record only.
pub struct Compact<K> {
    pub metadata: ObjectMeta,
    pub record: Record,
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
}

/// What [`Compact`] reads of an object's metadata, straight from the watch's bytes: nothing
/// else of it is built (labels, timestamps, the other annotations, other managers' fields).
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    /// An Event about a child names it by its uid too.
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default, rename = "annotations")]
    applied_hash: Option<AppliedHash>,
    /// The controller among them routes an event (which object to reconcile when this changes).
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default, rename = "managedFields")]
    operator_fields: Option<OperatorFields>,
}

/// The applied-hash annotation, read out of the annotations.
struct AppliedHash(Option<NonZeroU64>);

impl<'de> Deserialize<'de> for AppliedHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Annotations;
        impl<'de> Visitor<'de> for Annotations {
            type Value = AppliedHash;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("annotations")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AppliedHash, A::Error> {
                let mut hash = None;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    if key.0 == APPLIED_HASH_ANNOTATION {
                        hash = map.next_value::<Text<'de>>().map(|h| parse_hash(&h.0))?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(AppliedHash(hash))
            }
        }
        deserializer.deserialize_map(Annotations)
    }
}

/// The fields the manager `cdn-operator` applied to the main resource, read out of
/// managedFields (its first such entry).
struct OperatorFields(Option<Owned>);

impl<'de> Deserialize<'de> for OperatorFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entries = Vec::<Entry>::deserialize(deserializer)?;
        Ok(OperatorFields(entries.into_iter().find_map(|e| e.0)))
    }
}

/// One managedFields entry: its fields if it is the operator's apply to the main resource.
struct Entry(Option<Owned>);

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Entry;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a managedFields entry")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
                let is = |value: Option<Text>, wanted: &str| value.is_some_and(|v| v.0 == wanted);
                let (mut manager, mut operation) = (None, None);
                let mut main_resource = true;
                let mut fields = None;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match &*key.0 {
                        "manager" => manager = Some(is(map.next_value()?, FIELD_MANAGER)),
                        "operation" => operation = Some(is(map.next_value()?, "Apply")),
                        "subresource" => {
                            main_resource = map
                                .next_value::<Option<Text>>()?
                                .is_none_or(|s| s.0.is_empty())
                        }
                        // The server writes fieldsV1 after the manager and operation: another
                        // manager's fields are skipped unread.
                        "fieldsV1" if manager != Some(false) && operation != Some(false) => {
                            fields = map.next_value::<Option<Owned>>()?
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let ours = manager == Some(true) && operation == Some(true) && main_resource;
                Ok(Entry(fields.filter(|_| ours)))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Parts {
            #[serde(default)]
            metadata: Meta,
            /// Counts only: the rest of any status is skipped as it is read.
            #[serde(default)]
            status: Option<Rollout>,
        }
        let Parts { metadata, status } = Parts::deserialize(deserializer)?;
        // A status without counts (a Service's; a ConfigMap has none) costs nothing.
        let rollout = status.filter(|r| *r != Rollout::default()).map(Box::new);
        let record = Record {
            version: metadata
                .resource_version
                .as_deref()
                .unwrap_or_default()
                .into(),
            generation: metadata.generation.and_then(NonZeroI64::new),
            applied_hash: metadata.applied_hash.and_then(|h| h.0),
            owned: metadata
                .operator_fields
                .and_then(|f| f.0)
                .map(ArcIntern::new),
            rollout,
        };
        let metadata = ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            owner_references: metadata.owner_references.map(|refs| {
                refs.into_iter()
                    .filter(|r| r.controller == Some(true))
                    .collect()
            }),
            ..ObjectMeta::default()
        };
        Ok(Compact {
            metadata,
            record,
            kind: PhantomData,
        })
    }
}

impl<K: Resource<DynamicType = ()>> Serialize for Compact<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut value = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": self.metadata,
        });
        value["metadata"]["generation"] = self.record.generation.map(NonZeroI64::get).into();
        if let Some(rollout) = &self.record.rollout {
            value["status"] = serde_json::to_value(rollout).map_err(serde::ser::Error::custom)?;
        }
        value.serialize(serializer)
    }
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Compact {
            metadata: self.metadata.clone(),
            record: self.record.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compact")
            .field("metadata", &self.metadata)
            .field("record", &self.record)
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
    use serde_json::{json, Value};

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
            entry(FIELD_MANAGER, Some("status"), json!({"f:status": {}})),
            entry(FIELD_MANAGER, None, json!({"f:spec": {"f:replicas": {}}})),
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
                (APPLIED_HASH_ANNOTATION, "0123456789abcdef"),
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
        d.metadata.resource_version = Some("17".into());
        let compact = Compact::of(&d);
        assert_eq!(compact.metadata.name.as_deref(), Some("a"));
        assert_eq!(compact.metadata.managed_fields, None);
        assert_eq!(compact.metadata.labels, None, "labels are not read");
        assert_eq!(
            compact.metadata.uid.as_deref(),
            Some("uid-a"),
            "an Event about a child names it by its uid"
        );
        assert_eq!(
            compact.metadata.annotations, None,
            "the applied hash is read into the record; no annotation is kept"
        );
        assert_eq!(
            compact.metadata.owner_references,
            Some(vec![owner("lb", true)]),
            "the controller routes a change to its CdnCluster"
        );
        let record = &compact.record;
        assert_eq!(&*record.version, "17");
        assert_eq!(record.generation, NonZeroI64::new(3));
        assert!(record.applied_hash_is("0123456789abcdef"));
        assert!(!record.applied_hash_is("0123456789abcdee"));
        let owned = record.owned.as_ref().expect("the operator's apply entry");
        assert!(owned.covers(&json!({"spec": {"replicas": 1}})));
        assert!(!owned.covers(&json!({"spec": {"paused": true}})));

        let typed: Deployment = record.typed("a").unwrap();
        assert_eq!(typed.status.unwrap().ready_replicas, Some(2));
        assert_eq!(typed.metadata.generation, Some(3));
        assert_eq!(typed.metadata.name.as_deref(), Some("a"));
        assert_eq!(typed.spec, None, "the spec is not kept");
    }

    #[test]
    fn reads_the_operators_apply_from_an_event_as_the_server_writes_it() {
        // Keys in the server's order: an entry's manager and operation before its fields.
        let event = r#"{"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {
            "name": "a", "namespace": "n", "uid": "u", "resourceVersion": "9", "generation": 2,
            "labels": {"app": "a"},
            "annotations": {"deployment.kubernetes.io/revision": "1",
                "cdn-operator.anevia.com/applied-hash": "0123456789abcdef"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u1",
                "controller": true}],
            "managedFields": [
                {"manager": "kubectl", "operation": "Update", "apiVersion": "apps/v1",
                 "time": "2026-11-24T11:04:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:paused": {}}}},
                {"manager": "cdn-operator", "operation": "Apply", "apiVersion": "apps/v1",
                 "time": "2026-11-24T11:04:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "cdn-operator", "operation": "Apply", "apiVersion": "apps/v1",
                 "time": "2026-11-24T11:04:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:x": {}}}, "subresource": "status"},
                {"manager": "cdn-operator", "operation": "Update", "apiVersion": "apps/v1",
                 "time": "2026-11-24T11:04:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:minReadySeconds": {}}}}]},
            "spec": {"replicas": 1, "template": {"spec": {"containers": []}}},
            "status": {"observedGeneration": 2, "replicas": 1, "conditions": [{"type": "A"}]}}"#;
        let compact: Compact<Deployment> = serde_json::from_str(event).unwrap();
        let record = &compact.record;
        assert_eq!(
            record.owned.as_deref(),
            Some(&Owned::of(&json!({"f:spec": {"f:replicas": {}}}))),
            "the operator's apply to the main resource, not its status nor an update"
        );
        assert!(record.applied_hash_is("0123456789abcdef"));
        assert_eq!(
            (&*record.version, record.generation),
            ("9", NonZeroI64::new(2))
        );
        let rollout = record.rollout.as_deref().unwrap();
        assert_eq!(
            (rollout.observed_generation, rollout.replicas),
            (Some(2), Some(1))
        );
        assert_eq!(compact.metadata.namespace.as_deref(), Some("n"));
        assert_eq!(compact.metadata.owner_references.unwrap()[0].uid, "u1");

        // Nulls where the server may omit a field read as its absence.
        let sparse = r#"{"metadata": {"name": "a", "annotations": null, "managedFields": null,
            "ownerReferences": null}, "status": null}"#;
        let compact: Compact<Deployment> = serde_json::from_str(sparse).unwrap();
        assert_eq!(compact.record, Record::default());
        assert_eq!(compact.metadata.name.as_deref(), Some("a"));
    }

    #[test]
    fn the_applied_hash_is_kept_when_it_is_one_the_operator_writes() {
        let with = |hash: &str| {
            let mut d = Deployment::default();
            d.metadata.annotations =
                Some([(APPLIED_HASH_ANNOTATION.to_string(), hash.to_string())].into());
            Compact::of(&d).record
        };
        let hash = crate::kubernetes::record::hash(&json!({"a": 1}));
        assert!(with(&hash).applied_hash_is(&hash));
        assert!(!with(&hash).applied_hash_is(&crate::kubernetes::record::hash(&json!({"a": 2}))));
        assert!(!with(&hash.to_uppercase()).applied_hash_is(&hash));
        assert!(!with(&format!("+{}", &hash[1..])).applied_hash_is(&hash));
        assert!(!Compact::of(&Deployment::default())
            .record
            .applied_hash_is(&hash));
    }

    #[test]
    fn a_record_is_six_words() {
        // Thousands are cached per kind, in hash tables sized by the entry.
        assert_eq!(std::mem::size_of::<Record>(), 48);
    }

    #[test]
    fn a_status_without_rollout_counts_costs_nothing() {
        let s = k8s_openapi::api::core::v1::Service {
            status: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(Compact::of(&s).record.rollout, None);
    }

    #[test]
    fn children_of_one_shape_share_their_owned_fields() {
        let child = |name: &str, paths: Value| {
            let mut d = Deployment::default();
            d.metadata.name = Some(name.into());
            d.metadata.managed_fields = Some(vec![entry(FIELD_MANAGER, None, paths)]);
            Compact::of(&d)
        };
        let shape = json!({"f:spec": {"f:replicas": {}}});
        let (a, b) = (child("a", shape.clone()), child("b", shape));
        let c = child("c", json!({"f:spec": {"f:paused": {}}}));
        let owned = |c: &Compact<Deployment>| c.record.owned.clone().unwrap();
        assert!(std::ptr::eq(&*owned(&a), &*owned(&b)), "one copy");
        assert!(!std::ptr::eq(&*owned(&a), &*owned(&c)));
    }

    #[test]
    fn an_object_the_operator_never_applied_owns_nothing() {
        let mut d = Deployment::default();
        d.metadata.managed_fields = Some(vec![entry("kubectl", None, json!({"f:spec": {}}))]);
        assert!(Compact::of(&d).record.owned.is_none());
    }
}
