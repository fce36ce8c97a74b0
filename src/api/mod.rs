//! The custom resource types, and the CRDs generated from them: nothing else.

pub mod at;
pub mod cdncluster;
mod condition;
pub mod purge;

pub use at::{At, AtSpec, AtStatus, Outcome, Phase, AT_MAX_NAME_LEN};
pub use cdncluster::{
    CacheRule, CacheSpec, CacheVolume, CdnCluster, CdnClusterSpec, CdnClusterStatus, HttpSpec,
    IngressExposure, Origin, Pods, Role, ServiceExposure, ServiceOrigin, ServiceType, SignedUrls,
    Source, State, TlsSpec, TrafficPolicy, DEFAULT_TOKEN_NAME, MAX_NAME_LEN,
};
pub use condition::{Condition, Text};
pub use purge::{CdnPurge, CdnPurgeSpec, CdnPurgeStatus, PurgeMode, PurgePhase};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::json;

/// Every CRD the operator serves, as installed: the single source of truth for all manifests.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![cdncluster_crd(), at_crd(), CdnPurge::crd()];
    for crd in &mut crds {
        with_object_fields(crd);
    }
    crds
}

/// Declares apiVersion, kind and metadata in the root schema, as controller-gen does, so
/// `kubectl explain` documents them and offline validators accept whole objects.
fn with_object_fields(crd: &mut CustomResourceDefinition) {
    let fields = json!({
        "apiVersion": {
            "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
            "type": "string"
        },
        "kind": {
            "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
            "type": "string"
        },
        "metadata": {"type": "object"}
    });
    let fields: std::collections::BTreeMap<String, _> =
        serde_json::from_value(fields).expect("static schema");
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema
                .properties
                .get_or_insert_with(Default::default)
                .extend(fields.clone());
        }
    }
}

/// The CdnCluster CRD with root-level rules on `metadata.name`, which the derive cannot express:
/// the API server then refuses names the children could not carry.
fn cdncluster_crd() -> CustomResourceDefinition {
    let mut crd = CdnCluster::crd();
    with_root_rules(
        &mut crd,
        json!([
            {
                "rule": format!("self.metadata.name.size() <= {MAX_NAME_LEN}"),
                "message": format!("metadata.name must be at most {MAX_NAME_LEN} characters: the pod label <name>-deployment must fit in 63"),
            },
            {
                "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter): it also names the cluster's Service",
            }
        ]),
    );
    crd
}

/// The At CRD with a root-level rule on `metadata.name`: the pod carries the name as its `app`
/// label, whose values have at most 63 characters. Refused at admission rather than failing at
/// pod creation.
fn at_crd() -> CustomResourceDefinition {
    let mut crd = At::crd();
    with_root_rules(
        &mut crd,
        json!([{
            "rule": format!("self.metadata.name.size() <= {AT_MAX_NAME_LEN}"),
            "message": format!("metadata.name must be at most {AT_MAX_NAME_LEN} characters: the pod's label app: <name> must fit in 63"),
        }]),
    );
    crd
}

/// Sets CEL rules on the root schema of every version, where they can see `metadata.name`.
fn with_root_rules(crd: &mut CustomResourceDefinition, rules: serde_json::Value) {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema.x_kubernetes_validations =
                Some(serde_json::from_value(rules.clone()).expect("static rules"));
        }
    }
}

/// The CRDs as one multi-document YAML stream, as `cdn-operator crd` prints it.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| serde_yaml::to_string(crd).expect("a CRD always serializes"))
        .collect::<Vec<_>>()
        .join("---\n")
}
