//! The desired children of a CdnCluster: pure, from the CdnCluster and its resolved upstreams.

use super::nginx::{self, CacheTuning, Paths, Upstream, HEALTH_PATH, LISTEN_PORT};
use super::sources::SERVICE_PORT;
use crate::api::{CdnCluster, Role};
use crate::restricted::RunAs;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    HTTPGetAction, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// nginx image used when the spec names none: a pinned stable release of nginx's unprivileged
/// build, whose numeric USER (101) meets `runAsNonRoot` with no UID set in the pod (the official
/// `nginx` image runs as root, which the kubelet refuses) and which runs as any UID (OpenShift).
pub const DEFAULT_IMAGE: &str = "docker.io/nginxinc/nginx-unprivileged:1.28.0-alpine";
/// Label selecting the operator's own children, for its watches.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "cdn-operator";
/// The seed's pod label.
pub const POD_LABEL: &str = "deployment";
/// Pod template annotation that changes with the configuration, so a new config rolls out.
pub const CONFIG_HASH_ANNOTATION: &str = "cdn.anevia.com/config-hash";
/// The key of nginx.conf in the ConfigMap.
pub const CONFIG_KEY: &str = "nginx.conf";
const CONFIG_DIR: &str = "/etc/nginx/cdn";

pub fn deployment_name(cluster: &str) -> String {
    format!("{cluster}-deployment")
}

pub fn config_map_name(cluster: &str) -> String {
    format!("{cluster}-nginx")
}

/// The Service through which parents reach a cluster carries the cluster's own name.
pub fn service_name(cluster: &str) -> String {
    cluster.to_string()
}

/// Everything a CdnCluster owns.
#[derive(Clone, Debug)]
pub struct Children {
    pub config_map: ConfigMap,
    pub deployment: Deployment,
    pub service: Service,
}

/// Builds the children of `cluster` whose sources resolved to `upstreams`, its pods running as
/// `run_as` pins them.
pub fn children(cluster: &CdnCluster, upstreams: &[Upstream], run_as: &RunAs) -> Children {
    let name = cluster.name_any();
    let config = config(cluster, upstreams, &Paths::default());
    let config_hash = crate::apply::hash(config.as_str());
    Children {
        config_map: config_map(cluster, config),
        deployment: deployment(cluster, &config_hash, run_as),
        service: service(cluster, &name),
    }
}

/// The nginx configuration of `cluster`, with files under `paths`.
pub fn config(cluster: &CdnCluster, upstreams: &[Upstream], paths: &Paths) -> String {
    let title = format!(
        "CdnCluster {}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    nginx::render(
        &title,
        cluster.spec.role,
        upstreams,
        &cache_tuning(cluster),
        paths,
    )
}

fn cache_tuning(cluster: &CdnCluster) -> CacheTuning {
    let defaults = CacheTuning::default();
    let spec = cluster.spec.cache.as_deref().cloned().unwrap_or_default();
    CacheTuning {
        size: spec.size.unwrap_or(defaults.size),
        inactive: spec.inactive.unwrap_or(defaults.inactive),
        valid: spec.valid.unwrap_or(defaults.valid),
    }
}

/// Labels on every child, selecting the operator's children and telling which cluster owns them.
pub fn labels(cluster: &CdnCluster) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "cdncluster".into()),
        ("app.kubernetes.io/instance".into(), cluster.name_any()),
        (
            "app.kubernetes.io/component".into(),
            cluster.spec.role.as_str().into(),
        ),
        (MANAGED_BY_LABEL.into(), MANAGED_BY.into()),
    ])
}

fn metadata(cluster: &CdnCluster, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: cluster.namespace(),
        labels: Some(labels(cluster)),
        owner_references: cluster.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

fn config_map(cluster: &CdnCluster, config: String) -> ConfigMap {
    ConfigMap {
        metadata: metadata(cluster, config_map_name(&cluster.name_any())),
        data: Some(BTreeMap::from([(CONFIG_KEY.to_string(), config)])),
        ..ConfigMap::default()
    }
}

fn service(cluster: &CdnCluster, name: &str) -> Service {
    Service {
        metadata: metadata(cluster, service_name(name)),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                POD_LABEL.to_string(),
                deployment_name(name),
            )])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: SERVICE_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), Quantity("50m".into())),
            ("memory".into(), Quantity("64Mi".into())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".into(),
            Quantity("256Mi".into()),
        )])),
        ..ResourceRequirements::default()
    }
}

fn deployment(cluster: &CdnCluster, config_hash: &str, run_as: &RunAs) -> Deployment {
    let name = cluster.name_any();
    let deployment_name = deployment_name(&name);
    let selector = BTreeMap::from([(POD_LABEL.to_string(), deployment_name.clone())]);
    let mut pod_labels = labels(cluster);
    pod_labels.extend(selector.clone());

    let mut mounts = vec![
        VolumeMount {
            name: "config".into(),
            mount_path: CONFIG_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..VolumeMount::default()
        },
    ];
    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map_name(&name),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ];
    if cluster.spec.role == Role::Cache {
        mounts.push(VolumeMount {
            name: "cache".into(),
            mount_path: Paths::default().cache_dir,
            ..VolumeMount::default()
        });
        volumes.push(Volume {
            name: "cache".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }

    let probe = |initial_delay: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(HEALTH_PATH.into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(10),
        ..Probe::default()
    };

    let container = Container {
        name: "nginx".into(),
        image: Some(
            cluster
                .spec
                .image
                .clone()
                .unwrap_or_else(|| DEFAULT_IMAGE.into()),
        ),
        command: Some(vec![
            "nginx".into(),
            "-e".into(),
            "stderr".into(),
            "-c".into(),
            format!("{CONFIG_DIR}/{CONFIG_KEY}"),
            "-g".into(),
            "daemon off;".into(),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(LISTEN_PORT),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(probe(0)),
        liveness_probe: Some(probe(5)),
        resources: Some(
            cluster
                .spec
                .resources
                .as_deref()
                .cloned()
                .unwrap_or_else(default_resources),
        ),
        security_context: Some(crate::restricted::container()),
        volume_mounts: Some(mounts),
        ..Container::default()
    };

    Deployment {
        metadata: metadata(cluster, deployment_name),
        spec: Some(DeploymentSpec {
            replicas: Some(cluster.spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([(
                        CONFIG_HASH_ANNOTATION.to_string(),
                        config_hash.to_string(),
                    )])),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    security_context: Some(crate::restricted::pod(run_as)),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}
