//! What a field manager owns of an object, as server-side apply records it in `managedFields`
//! (`fieldsV1`), and whether that still covers an object the manager would apply. Domain-free.
//!
//! Why ownership and not values: the API server drops zero values (`initialDelaySeconds: 0`),
//! fills in defaults, normalizes quantities, and other controllers write beside the operator, so
//! comparing the applied values with the stored ones finds differences that are not drift, and
//! each costs a write. A field the operator applied stays in its managedFields entry whatever the
//! server does to the value, until another manager changes or removes it: exactly the drift that
//! needs a new apply.

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The fields one manager owns, kept compact for a cache: the hash of each path of its
/// `fieldsV1` tree, and apart those of its leaves (which own everything below them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Owned {
    nodes: Box<[u64]>,
    leaves: Box<[u64]>,
}

const ROOT: u64 = 0;

/// The path `parent` extended by one element, `prefix` (`f:`, `k:`, `v:`) then `name`: hashed in
/// two parts so a field name needs no new string.
fn step(parent: u64, prefix: &str, name: &str) -> u64 {
    // SipHash with fixed keys: the same path hashes alike on both sides of a comparison.
    let mut hasher = DefaultHasher::new();
    parent.hash(&mut hasher);
    prefix.hash(&mut hasher);
    name.hash(&mut hasher);
    hasher.finish()
}

impl Owned {
    /// The fields of a `fieldsV1` tree (`{"f:spec": {"f:replicas": {}}, ...}`); none for
    /// anything but a map.
    pub fn of(fields_v1: &Value) -> Owned {
        Owned::deserialize(fields_v1).unwrap_or_default()
    }

    /// Whether every field an apply of `object` would own is owned here. Server-managed metadata,
    /// `apiVersion`, `kind` and `status` are not fields an apply owns.
    pub fn covers(&self, object: &Value) -> bool {
        let Some(map) = object.as_object() else {
            return true;
        };
        map.iter().all(|(key, value)| match (key.as_str(), value) {
            ("apiVersion" | "kind" | "status", _) => true,
            ("metadata", Value::Object(meta)) => {
                let metadata = step(ROOT, "f:", "metadata");
                meta.iter()
                    .filter(|(k, _)| !SERVER_METADATA.contains(&k.as_str()))
                    .all(|(k, v)| self.covers_value(step(metadata, "f:", k), k, v))
            }
            _ => self.covers_value(step(ROOT, "f:", key), key, value),
        })
    }

    fn has(&self, path: u64) -> bool {
        self.nodes.binary_search(&path).is_ok()
    }

    fn owns_all_below(&self, path: u64) -> bool {
        self.leaves.binary_search(&path).is_ok()
    }

    /// Whether the field at `here`, named `name`, holding `value`, is owned with all it holds.
    fn covers_value(&self, here: u64, name: &str, value: &Value) -> bool {
        if !self.has(here) {
            return false;
        }
        if self.owns_all_below(here) {
            return true;
        }
        match value {
            Value::Object(map) if !map.is_empty() => map
                .iter()
                .all(|(k, v)| self.covers_value(step(here, "f:", k), k, v)),
            Value::Array(items) if !items.is_empty() => match list_type(name, &items[0]) {
                ListType::Map(keys) => items.iter().all(|item| {
                    let element = step(here, "k:", &element_key(keys, item));
                    self.covers_value(element, "", item)
                }),
                ListType::Set => items
                    .iter()
                    .all(|item| self.has(step(here, "v:", &item.to_string()))),
                // Owned as a whole: its presence above is all there is.
                ListType::Atomic => true,
            },
            // A scalar, or an empty map or list: a leaf, present above.
            _ => true,
        }
    }
}

/// Read straight from the watch's bytes: a `fieldsV1` tree has a map per field, and building
/// them (as a `serde_json::Value`) only to hash their paths was most of the cost of reading a
/// child's event.
impl<'de> Deserialize<'de> for Owned {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (mut nodes, mut leaves) = (Vec::new(), Vec::new());
        deserializer.deserialize_any(Walk {
            path: ROOT,
            nodes: &mut nodes,
            leaves: &mut leaves,
        })?;
        nodes.sort_unstable();
        nodes.dedup();
        leaves.sort_unstable();
        Ok(Owned {
            nodes: nodes.into(),
            leaves: leaves.into(),
        })
    }
}

/// One element of a `fieldsV1` tree at `path`: a map of the elements below it, or anything
/// else (a leaf). The root is no field, hence never a leaf.
struct Walk<'a> {
    path: u64,
    nodes: &'a mut Vec<u64>,
    leaves: &'a mut Vec<u64>,
}

impl Walk<'_> {
    fn leaf(self) {
        if self.path != ROOT {
            self.leaves.push(self.path);
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a fieldsV1 tree")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut below = false;
        while let Some(element) = map.next_key::<Text<'de>>()? {
            let element: &str = &element.0;
            // "." marks the list element or map itself; its fields are listed beside it.
            // Every other element is a two-character prefix and a name (`f:spec`).
            below |= element != ".";
            if element == "." || element.len() < 2 || !element.is_char_boundary(2) {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let (prefix, name) = element.split_at(2);
            let name = if prefix == "k:" && is_uid_alone(name) {
                ANY_UID
            } else {
                name
            };
            let here = step(self.path, prefix, name);
            self.nodes.push(here);
            map.next_value_seed(Walk {
                path: here,
                nodes: self.nodes,
                leaves: self.leaves,
            })?;
        }
        if !below {
            self.leaf();
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.leaf();
        Ok(())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.leaf();
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.visit_unit()
    }
}

/// A string borrowed from the input when it can be (no escapes), owned otherwise.
pub(crate) struct Text<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                text: &'de str,
            ) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }

            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// Metadata the server keeps for itself: never in a manager's fields.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

enum ListType {
    /// An associative list: elements are identified by these keys (`x-kubernetes-list-map-keys`).
    Map(&'static [&'static str]),
    /// A set of scalars (`x-kubernetes-list-type: set`).
    Set,
    Atomic,
}

/// The list types of the core objects the operator writes, from the Kubernetes API's
/// `x-kubernetes-list-type` markers. A list missing here counts as atomic: that can only make the
/// check coarser (a change inside it goes unseen), never report a difference that is not there,
/// since an owned list covers its elements whichever way the server records them.
fn list_type(name: &str, first: &Value) -> ListType {
    match name {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => ListType::Map(&["name"]),
        "ownerReferences" => ListType::Map(&["uid"]),
        "volumeMounts" => ListType::Map(&["mountPath"]),
        "volumeDevices" => ListType::Map(&["devicePath"]),
        "conditions" => ListType::Map(&["type"]),
        "hostAliases" => ListType::Map(&["ip"]),
        "topologySpreadConstraints" => ListType::Map(&["topologyKey", "whenUnsatisfiable"]),
        "ports" if first.get("containerPort").is_some() => {
            ListType::Map(&["containerPort", "protocol"])
        }
        "ports" => ListType::Map(&["port", "protocol"]),
        "finalizers" => ListType::Set,
        _ => ListType::Atomic,
    }
}

/// How the element of a list keyed by uid alone (`ownerReferences`) is named in a path,
/// whatever its uid. Each child's owner has its own uid: with it in the paths, no two children
/// would own equal sets and a cache could not hold them once (they are interned). Which owner
/// is not lost: it is in what the operator applies, hence in the applied hash (`apply`).
const ANY_UID: &str = "{\"uid\"}";

/// Whether a `k:` path element names an element by its uid alone, as [`element_key`] does for a
/// list keyed by `uid`: the two sides of a comparison must agree.
fn is_uid_alone(name: &str) -> bool {
    name.starts_with("{\"uid\":")
        && serde_json::from_str::<Map<String, Value>>(name).is_ok_and(|key| key.len() == 1)
}

/// The name of one associative list element's path element (after `k:`): its keys as JSON,
/// in order, as `{"name":"nginx"}` ([`ANY_UID`] for a uid alone).
fn element_key(keys: &[&str], item: &Value) -> String {
    if keys == ["uid"] {
        return ANY_UID.to_string();
    }
    let key: Map<String, Value> = keys
        .iter()
        .filter_map(|k| Some((k.to_string(), item.get(*k)?.clone())))
        .collect();
    Value::Object(key).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment_fields() -> Value {
        json!({
            "f:metadata": {"f:labels": {"f:app": {}}, "f:ownerReferences": {"k:{\"uid\":\"u1\"}": {}}},
            "f:spec": {
                "f:replicas": {},
                "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"nginx\"}": {
                    ".": {}, "f:name": {}, "f:image": {}, "f:command": {},
                    "f:ports": {"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}, "f:protocol": {}}},
                    "f:readinessProbe": {"f:initialDelaySeconds": {}, "f:periodSeconds": {}}
                }}}}
            }
        })
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns", "labels": {"app": "a"},
                "ownerReferences": [{"uid": "u1", "name": "c", "kind": "K", "apiVersion": "v1"}]},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{
                "name": "nginx", "image": "nginx", "command": ["nginx", "-g"],
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "readinessProbe": {"initialDelaySeconds": 0, "periodSeconds": 10}
            }]}}}
        })
    }

    #[test]
    fn an_applied_object_is_covered_by_its_own_fields_whatever_the_values() {
        let owned = Owned::of(&deployment_fields());
        assert!(owned.covers(&deployment()));
        // Values play no part: the server may have dropped a zero or normalized a quantity.
        let mut other = deployment();
        other["spec"]["replicas"] = json!(0);
        assert!(owned.covers(&other));
    }

    #[test]
    fn a_field_taken_or_added_is_not_covered() {
        let owned = Owned::of(&deployment_fields());
        let mut added = deployment();
        added["spec"]["paused"] = json!(true);
        assert!(!owned.covers(&added));

        // Another manager changed the image: the server moved that field to its entry.
        let mut taken = deployment_fields();
        taken["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"nginx\"}"]
            .as_object_mut()
            .unwrap()
            .remove("f:image");
        assert!(!Owned::of(&taken).covers(&deployment()));

        let mut other_container = deployment();
        other_container["spec"]["template"]["spec"]["containers"][0]["name"] = json!("envoy");
        assert!(!owned.covers(&other_container));
        assert!(!Owned::default().covers(&deployment()));
    }

    #[test]
    fn the_fields_of_children_of_different_owners_are_equal() {
        let mut other_owner = deployment_fields();
        other_owner["f:metadata"]["f:ownerReferences"] = json!({"k:{\"uid\":\"u2\"}": {
            ".": {}, "f:uid": {}, "f:name": {}, "f:kind": {}, "f:apiVersion": {}}});
        let mut fields = deployment_fields();
        fields["f:metadata"]["f:ownerReferences"] = json!({"k:{\"uid\":\"u1\"}": {
            ".": {}, "f:uid": {}, "f:name": {}, "f:kind": {}, "f:apiVersion": {}}});
        // Equal, so a cache holds them once.
        assert_eq!(Owned::of(&fields), Owned::of(&other_owner));
        assert!(Owned::of(&fields).covers(&deployment()));

        // A key of a uid and more is not a uid alone: kept whole, as a comparison computes it.
        assert!(!is_uid_alone("{\"uid\":\"u1\",\"name\":\"a\"}"));
        assert!(is_uid_alone("{\"uid\":\"u1\"}"));

        // An owner reference taken away by another manager is still seen.
        let mut taken = fields.clone();
        taken["f:metadata"]
            .as_object_mut()
            .unwrap()
            .remove("f:ownerReferences");
        assert!(!Owned::of(&taken).covers(&deployment()));
    }

    #[test]
    fn a_list_owned_whole_covers_its_elements() {
        // A manager that records lists as atomic (or an older server): the list is a leaf.
        let atomic = json!({"f:metadata": {"f:labels": {"f:app": {}}, "f:ownerReferences": {}},
            "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {}}}}});
        assert!(Owned::of(&atomic).covers(&deployment()));
    }

    #[test]
    fn read_from_bytes_or_from_a_value_alike() {
        let fields = deployment_fields();
        let from_bytes: Owned = serde_json::from_str(&fields.to_string()).unwrap();
        assert_eq!(from_bytes, Owned::of(&fields));
        assert!(from_bytes.covers(&deployment()));
        // Anything but a map below a field is a leaf, as `{}` is; anything but a map at the
        // top owns nothing (the server never writes either).
        let odd = json!({"f:spec": {"f:replicas": null, "f:paused": [1], "f:x": "y", ".": {}}});
        let owned: Owned = serde_json::from_str(&odd.to_string()).unwrap();
        assert_eq!(owned, Owned::of(&odd));
        assert!(owned.covers(&json!({"spec": {"replicas": 1, "paused": true, "x": {"y": 1}}})));
        assert!(!owned.covers(&json!({"spec": {"minReadySeconds": 1}})));
        for top in ["null", "[]", "1", "\"f:spec\""] {
            assert_eq!(
                serde_json::from_str::<Owned>(top).unwrap(),
                Owned::default()
            );
        }
        assert!(serde_json::from_str::<Owned>("{\"f:spec\": ").is_err());
    }

    #[test]
    fn sets_are_owned_by_value() {
        let owned = Owned::of(&json!({"f:metadata": {"f:finalizers": {".": {}, "v:\"a/b\"": {}}}}));
        assert!(owned.covers(&json!({"metadata": {"finalizers": ["a/b"]}})));
        assert!(!owned.covers(&json!({"metadata": {"finalizers": ["a/b", "c"]}})));
    }
}
