//! `metav1.Condition` of the status of both kinds: the same schema and JSON as k8s-openapi's, its
//! strings interned.
//!
//! Why: the operator caches every CdnCluster with its status, and the conditions were most of
//! it (four conditions, sixteen strings, ~1.2 KiB per object). Thousands of objects carry the same
//! few types, statuses, reasons and messages, so each distinct string is held once.

use internment::ArcIntern;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;

/// An immutable, interned string: equal texts share one allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(ArcIntern<String>);

impl Text {
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl Default for Text {
    fn default() -> Self {
        Text::from("")
    }
}

impl Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Text {
    fn from(text: &str) -> Self {
        Text(ArcIntern::from_ref(text))
    }
}

impl From<String> for Text {
    fn from(text: String) -> Self {
        Text(ArcIntern::new(text))
    }
}

impl From<Text> for String {
    fn from(text: Text) -> Self {
        text.as_str().to_string()
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Text> for String {
    fn eq(&self, other: &Text) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Text> for &str {
    fn eq(&self, other: &Text) -> bool {
        *self == other.as_str()
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self)
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        Ok(Text::from(&*text))
    }
}

/// Details of one aspect of the current state of an object (`metav1.Condition`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// When the condition last changed status.
    #[serde(default = "epoch")]
    pub last_transition_time: Time,
    /// Human-readable details of the transition; may be empty.
    #[serde(default)]
    pub message: Text,
    /// The `metadata.generation` the condition was set from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// A CamelCase identifier of the reason for the last transition.
    #[serde(default)]
    pub reason: Text,
    /// True, False or Unknown.
    #[serde(default)]
    pub status: Text,
    /// The condition's type, CamelCase.
    #[serde(rename = "type", default)]
    pub type_: Text,
}

/// What k8s-openapi reads a missing lastTransitionTime as.
fn epoch() -> Time {
    Time(jiff::Timestamp::UNIX_EPOCH)
}

/// The schema of `metav1.Condition`, as k8s-openapi has it: the CRDs stay as they were.
impl JsonSchema for Condition {
    fn schema_name() -> Cow<'static, str> {
        <k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition as JsonSchema>::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition as JsonSchema>::json_schema(
            generator,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_and_writes_the_json_of_metav1_condition() {
        let value = json!({
            "lastTransitionTime": "2026-11-23T10:58:57Z",
            "message": "0/1 replicas are ready, rolling out",
            "observedGeneration": 1,
            "reason": "Deploying",
            "status": "False",
            "type": "Ready",
        });
        let ours: Condition = serde_json::from_value(value.clone()).unwrap();
        let theirs: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition =
            serde_json::from_value(value.clone()).unwrap();
        assert_eq!(serde_json::to_value(&ours).unwrap(), value);
        assert_eq!(serde_json::to_value(&theirs).unwrap(), value);
        assert_eq!(ours.type_, "Ready");
        assert_eq!(ours.observed_generation, Some(1));

        let mut bare = value.clone();
        bare.as_object_mut().unwrap().remove("observedGeneration");
        let ours: Condition = serde_json::from_value(bare.clone()).unwrap();
        assert_eq!(serde_json::to_value(&ours).unwrap(), bare);
    }

    #[test]
    fn equal_texts_share_one_copy() {
        let a = Text::from("Every source exists");
        let b = Text::from(String::from("Every source exists"));
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(a, "Every source exists");
        assert_ne!(a, Text::from("Children are applied"));
    }

    #[test]
    fn the_schema_is_metav1_conditions() {
        let ours = schemars::schema_for!(Condition);
        let theirs =
            schemars::schema_for!(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition);
        assert_eq!(ours, theirs);
    }
}
