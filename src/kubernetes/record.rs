//! What the operator keeps of an object it applies, the leaf the write path and the caches stand
//! on: the field manager and applied-hash annotation its applies carry, and the [`Record`] a cache
//! keeps (version, generation, applied hash, the fields its last apply still owns, rollout counts).

use super::fields::Owned;
use internment::ArcIntern;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::num::{NonZeroI64, NonZeroU64};

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "cdn-operator";

/// Annotation holding a hash of what the operator last applied to an object: a change of what
/// it applies, a field dropped included, changes the hash.
pub const APPLIED_HASH_ANNOTATION: &str = "cdn-operator.anevia.com/applied-hash";

/// The Deployment's rollout made no progress within `progressDeadlineSeconds`: the reason of the
/// one condition a [`Rollout`] keeps, here so the record needs nothing of [`super::problems`].
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

/// A short, stable digest of `value`'s compact JSON form (serde_json writes a `Value`'s map
/// keys in order). Streamed into the digest: the JSON text of a Deployment or a ConfigMap is
/// never built.
pub fn hash<T: Serialize + ?Sized>(value: &T) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    let mut digest = Sha256::new();
    serde_json::to_writer(&mut digest, value).expect("hashed values always serialize to JSON");
    let digest = digest.finalize();
    digest[..8]
        .iter()
        .fold(String::with_capacity(16), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

/// What the operator reads of a cached object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Its resourceVersion (to wait for a write to reach the cache).
    pub version: Box<str>,
    /// Its generation (is its status current); generations start at 1. `NonZero`, as the hash:
    /// thousands of records are cached, and each `Option` tag would cost a word.
    pub generation: Option<NonZeroI64>,
    /// The applied-hash annotation, when it is one the operator writes (16 lowercase hex digits).
    pub(super) applied_hash: Option<NonZeroU64>,
    /// The fields of the operator's own apply (its managedFields entry for the main resource),
    /// `None` when it has none. Interned: children of one kind and shape own the same fields
    /// (fieldsV1 names fields and list keys, not values), so thousands share one copy.
    pub owned: Option<ArcIntern<Owned>>,
    /// The rollout counts of its status, if it has any (a Deployment's).
    pub rollout: Option<Box<Rollout>>,
}

/// The replica counts of a workload's status, and the generation they describe.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Whether the rollout exceeded its progress deadline (a Deployment's `Progressing`
    /// condition, False with reason `ProgressDeadlineExceeded`): the one condition a status
    /// reads, kept as a flag, written back as that condition alone.
    #[serde(
        default,
        rename = "conditions",
        skip_serializing_if = "std::ops::Not::not",
        with = "deadline"
    )]
    pub deadline_exceeded: bool,
}

/// [`Rollout::deadline_exceeded`] read from and written as a status's `conditions`.
mod deadline {
    use super::PROGRESS_DEADLINE_EXCEEDED;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Whatever a server writes: a condition it does not fill is not the deadline's.
    #[derive(Deserialize, Serialize)]
    struct Condition {
        #[serde(default, rename = "type")]
        type_: Option<String>,
        #[serde(default)]
        status: Option<String>,
        #[serde(default)]
        reason: Option<String>,
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        let conditions = Option::<Vec<Condition>>::deserialize(deserializer)?;
        Ok(conditions.into_iter().flatten().any(|c| {
            c.type_.as_deref() == Some("Progressing")
                && c.status.as_deref() == Some("False")
                && c.reason.as_deref() == Some(PROGRESS_DEADLINE_EXCEEDED)
        }))
    }

    pub fn serialize<S: Serializer>(exceeded: &bool, serializer: S) -> Result<S::Ok, S::Error> {
        let condition = Condition {
            type_: Some("Progressing".into()),
            status: Some("False".into()),
            reason: Some(PROGRESS_DEADLINE_EXCEEDED.into()),
        };
        [condition][..usize::from(*exceeded)].serialize(serializer)
    }
}

/// The applied hash as cached: 16 lowercase hex digits (what [`hash`] writes), or
/// nothing (any other value matches no hash the operator computes). The hash 0 is nothing too: it
/// would only cost one needless apply, once in 2^64.
pub(super) fn parse_hash(text: &str) -> Option<NonZeroU64> {
    let hex = text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    hex.then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
        .and_then(NonZeroU64::new)
}

impl Record {
    /// Whether the object carries `hash` as its applied hash.
    pub fn applied_hash_is(&self, hash: &str) -> bool {
        self.applied_hash.is_some() && self.applied_hash == parse_hash(hash)
    }

    /// Whether `other` is this record at another resourceVersion: nothing the operator reads
    /// of the object differs.
    pub fn same_but_version(&self, other: &Record) -> bool {
        let Record {
            version: _,
            generation,
            applied_hash,
            owned,
            rollout,
        } = self;
        (generation, applied_hash, owned, rollout)
            == (
                &other.generation,
                &other.applied_hash,
                &other.owned,
                &other.rollout,
            )
    }

    /// The cached object as `K`, named `name`: its generation and status counts, no spec.
    pub fn typed<K>(&self, name: &str) -> Result<K, serde_json::Error>
    where
        K: DeserializeOwned + Resource<DynamicType = ()>,
    {
        let mut value = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": {"name": name, "resourceVersion": &*self.version, "generation": self.generation},
        });
        if let Some(rollout) = &self.rollout {
            value["status"] = serde_json::to_value(rollout)?;
        }
        serde_json::from_value(value)
    }
}

#[cfg(test)]
mod tests {
    use super::hash;
    use serde_json::{json, Value};

    #[test]
    fn the_hash_is_the_first_8_bytes_of_the_sha256_of_the_compact_json() {
        // Pinned: a changed digest would re-apply every child of every CdnCluster on upgrade.
        assert_eq!(hash(&json!({"a": 1})), "015abd7f5cc57a2d");
        // sha256 of the JSON string "line\n\"quoted\"", escapes included.
        assert_eq!(hash("line\n\"quoted\""), "df6b0d43eb9f37e6");
        assert_eq!(
            hash("line\n\"quoted\""),
            hash(&Value::String("line\n\"quoted\"".into()))
        );
        let object = json!({"b": [1, "x"], "a": {"d": null, "c": true}});
        let text = object.to_string();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(hash(&object), hash(&parsed));
        assert_ne!(hash(&object), hash(&json!({"b": [1, "y"]})));
    }
}
