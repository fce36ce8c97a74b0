//! A compact cached copy of an object: its metadata, and the rest as compact JSON text with long
//! strings replaced by their digest. Domain-free.
//!
//! Why: k8s-openapi types hold every optional field inline (a `Volume` is 3 KiB, a `Container`
//! 2 KiB), so a cached Deployment costs ~20 KiB for ~2 KiB of JSON. The operator only compares
//! cached children with desired ones (`apply::contains`) and reads a Deployment's status, which
//! this keeps exactly, at a tenth of the memory.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// Strings at least this long are kept as their digest (the nginx configuration, say).
const LONG: usize = 128;
/// Marks a digest; no Kubernetes field value starts with a control character.
const DIGEST: &str = "\u{1}sha256:";

/// The digest that stands for a long string.
pub fn digest(s: &str) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(s.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{DIGEST}{hex}")
}

/// Whether `cached` (a string of a compact copy) stands for `full`.
pub fn same_string(cached: &str, full: &str) -> bool {
    cached == full || (cached.starts_with(DIGEST) && full.len() >= LONG && cached == digest(full))
}

fn shorten(value: &mut Value) {
    match value {
        Value::String(s) if s.len() >= LONG => *s = digest(s),
        Value::Array(items) => items.iter_mut().for_each(shorten),
        Value::Object(map) => map.values_mut().for_each(shorten),
        _ => {}
    }
}

/// An object of kind `K` as cached: `metadata`, and everything else as compact JSON.
pub struct Compact<K> {
    pub metadata: ObjectMeta,
    body: Box<str>,
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

    /// The cached object as JSON, long strings as digests.
    pub fn to_value(&self) -> Value {
        let mut value: Value = serde_json::from_str(&self.body).expect("the body is JSON we wrote");
        value["metadata"] = serde_json::to_value(&self.metadata).expect("metadata serializes");
        value
    }

    /// The cached object as `K` (long strings are digests): to read its status.
    pub fn typed(&self) -> Result<K, serde_json::Error>
    where
        K: DeserializeOwned,
    {
        serde_json::from_value(self.to_value())
    }
}

impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut map = serde_json::Map::<String, Value>::deserialize(deserializer)?;
        let metadata = match map.remove("metadata") {
            Some(m) => serde_json::from_value(m).map_err(D::Error::custom)?,
            None => ObjectMeta::default(),
        };
        let mut body = Value::Object(map);
        shorten(&mut body);
        Ok(Compact {
            metadata,
            body: body.to_string().into_boxed_str(),
            kind: PhantomData,
        })
    }
}

impl<K> Serialize for Compact<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Compact {
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compact")
            .field("metadata", &self.metadata)
            .field("body", &self.body)
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
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::BTreeMap;

    #[test]
    fn keeps_metadata_status_and_short_fields_and_digests_long_strings() {
        let config = "x".repeat(4000);
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("a".into());
        cm.data = Some(BTreeMap::from([
            ("nginx.conf".into(), config.clone()),
            ("short".into(), "value".into()),
        ]));
        let compact = Compact::of(&cm);
        assert_eq!(compact.metadata.name.as_deref(), Some("a"));
        let value = compact.to_value();
        assert_eq!(value["kind"], "ConfigMap");
        assert_eq!(value["data"]["short"], "value");
        let cached = value["data"]["nginx.conf"].as_str().unwrap();
        assert!(cached.len() < 100);
        assert!(same_string(cached, &config));
        assert!(!same_string(cached, &"y".repeat(4000)));
        assert!(!same_string("value", "other"));

        let mut d = Deployment::default();
        d.metadata.generation = Some(3);
        d.status = Some(DeploymentStatus {
            ready_replicas: Some(2),
            ..DeploymentStatus::default()
        });
        let typed = Compact::of(&d).typed().unwrap();
        assert_eq!(typed.status.unwrap().ready_replicas, Some(2));
        assert_eq!(typed.metadata.generation, Some(3));
    }

    #[test]
    fn a_digest_never_matches_a_short_string_that_looks_like_one() {
        let fake = digest("x");
        assert!(!same_string(&fake, "x"), "short strings are never digested");
    }
}
