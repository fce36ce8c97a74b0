//! The custom resource types, and the CRDs generated from them: nothing else.

pub mod at;
pub mod cdncluster;

pub use at::{At, AtSpec, AtStatus, Outcome, Phase};
pub use cdncluster::{
    CacheSpec, CdnCluster, CdnClusterSpec, CdnClusterStatus, Origin, Role, ServiceOrigin, Source,
    State, MAX_NAME_LEN,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::json;

/// Every CRD the operator serves, as installed: the single source of truth for all manifests.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![cdncluster_crd(), At::crd()]
}

/// The CdnCluster CRD with root-level rules on `metadata.name`, which the derive cannot express:
/// the API server then refuses names the children could not carry.
fn cdncluster_crd() -> CustomResourceDefinition {
    let mut crd = CdnCluster::crd();
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        let rules = json!([
            {
                "rule": format!("self.metadata.name.size() <= {MAX_NAME_LEN}"),
                "message": format!("metadata.name must be at most {MAX_NAME_LEN} characters: the pod label <name>-deployment must fit in 63"),
            },
            {
                "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter): it also names the cluster's Service",
            }
        ]);
        schema.x_kubernetes_validations = Some(serde_json::from_value(rules).expect("static rules"));
    }
    crd
}

/// The CRDs as one multi-document YAML stream, as `cdn-operator crd` prints it.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| serde_yaml::to_string(crd).expect("a CRD always serializes"))
        .collect::<Vec<_>>()
        .join("---\n")
}
