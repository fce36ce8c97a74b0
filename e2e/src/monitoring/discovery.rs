//! Kubernetes service discovery for a Prometheus built without it. Debian's Prometheus has no
//! `kubernetes_sd_configs` (NEWS.Debian: "Kubernetes support has been completely removed"), so
//! the test discovers the targets itself, as Prometheus's own discovery does for the roles the
//! Prometheus Operator uses (`endpoints` for a ServiceMonitor, `pod` for a PodMonitor), with the
//! same `__meta_kubernetes_*` labels, and hands them to Prometheus as `file_sd_configs`. The
//! Operator's relabelings then run in the real Prometheus, unchanged.
//!
//! The labels follow Prometheus's `discovery/kubernetes` (endpoints.go, pod.go): the namespace,
//! the Endpoints' and Service's names, labels and annotations, each address and port with its
//! readiness and target, the pod's labels, phase, readiness and controller, and the container
//! whose port it is (init containers included, flagged); the pod role gives one target per
//! container port. Node and namespace metadata (`attach_metadata`) are not modelled: no config
//! the Operator writes for the shipped monitors asks for them.

use k8s_openapi::api::core::v1::{Container, ContainerPort, Endpoints, Pod, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What one scrape configuration's discovery asks: a role, the namespaces (none: every one),
/// and the file Prometheus reads its targets from.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub role: Role,
    pub namespaces: Vec<String>,
    pub file: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Role {
    Endpoints,
    Pod,
}

/// Replaces each configuration's `kubernetes_sd_configs` by `file_sd_configs` on a file under
/// `dir`, and returns what to discover for each. An SD option this discovery does not model
/// (selectors, attach_metadata, another role, an API server) is an error.
pub fn file_sd(configs: &mut [Value], dir: &Path) -> Result<Vec<Job>, String> {
    let mut jobs = Vec::new();
    for (i, config) in configs.iter_mut().enumerate() {
        let name = config["job_name"].as_str().unwrap_or_default().to_string();
        let Some(object) = config.as_object_mut() else {
            return Err(format!("scrape config {i} is not an object"));
        };
        let Some(sd) = object.remove("kubernetes_sd_configs") else {
            continue;
        };
        let mut files = Vec::new();
        for (j, sd) in sd.as_array().into_iter().flatten().enumerate() {
            let mut role = None;
            let mut namespaces = Vec::new();
            for (key, value) in sd.as_object().into_iter().flatten() {
                match key.as_str() {
                    "role" => {
                        role = match value.as_str() {
                            Some("endpoints") => Some(Role::Endpoints),
                            Some("pod") => Some(Role::Pod),
                            other => return Err(format!("{name}: role {other:?} is not modelled")),
                        }
                    }
                    "namespaces" => {
                        for (k, v) in value.as_object().into_iter().flatten() {
                            match k.as_str() {
                                "names" => {
                                    namespaces = serde_json::from_value(v.clone())
                                        .map_err(|e| format!("{name}: namespaces.names: {e}"))?
                                }
                                other => {
                                    return Err(format!(
                                        "{name}: namespaces.{other} is not modelled"
                                    ))
                                }
                            }
                        }
                    }
                    // Where Prometheus reaches the API server: this discovery uses the test's client.
                    "kubeconfig_file" => {}
                    other => {
                        return Err(format!(
                            "{name}: kubernetes_sd_configs.{other} is not modelled"
                        ))
                    }
                }
            }
            let role =
                role.ok_or_else(|| format!("{name}: a kubernetes_sd_config without role"))?;
            let file = dir.join(format!("{}-{j}.json", sanitize(&name)));
            files.push(file.display().to_string());
            jobs.push(Job {
                role,
                namespaces,
                file,
            });
        }
        object.insert(
            "file_sd_configs".into(),
            json!([{"files": files, "refresh_interval": "1s"}]),
        );
    }
    Ok(jobs)
}

/// Discovers every job's targets now and every `every` after, writing each file whole (a
/// rename: Prometheus never reads half of one), until dropped.
pub struct Discovery {
    stop: Arc<AtomicBool>,
}

impl Discovery {
    /// Discovers once (so the files exist before Prometheus starts), then keeps discovering on a
    /// task of its own.
    pub async fn start(
        client: Client,
        jobs: Vec<Job>,
        every: Duration,
    ) -> Result<Discovery, String> {
        discover(&client, &jobs).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        tokio::spawn(async move {
            while !stopped.load(Ordering::Relaxed) {
                tokio::time::sleep(every).await;
                if let Err(e) = discover(&client, &jobs).await {
                    // An API server busy for a moment: the files keep the last targets, as
                    // Prometheus keeps them when its watch fails.
                    eprintln!("discovery: {e}");
                }
            }
        });
        Ok(Discovery { stop })
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn list<K>(client: &Client, namespaces: &[String]) -> Result<Vec<K>, String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let params = ListParams::default();
    if namespaces.is_empty() {
        return Api::<K>::all(client.clone())
            .list(&params)
            .await
            .map(|l| l.items)
            .map_err(|e| e.to_string());
    }
    let mut items = Vec::new();
    for ns in namespaces {
        let listed = Api::<K>::namespaced(client.clone(), ns)
            .list(&params)
            .await
            .map_err(|e| e.to_string())?;
        items.extend(listed.items);
    }
    Ok(items)
}

async fn discover(client: &Client, jobs: &[Job]) -> Result<(), String> {
    for job in jobs {
        let pods: Vec<Pod> = list(client, &job.namespaces).await?;
        let groups = match job.role {
            Role::Pod => pod_targets(&pods),
            Role::Endpoints => {
                let endpoints: Vec<Endpoints> = list(client, &job.namespaces).await?;
                let services: Vec<Service> = list(client, &job.namespaces).await?;
                endpoints_targets(&endpoints, &services, &pods)
            }
        };
        let text = serde_json::to_string(&groups).expect("JSON");
        let staged = job.file.with_extension("json.new");
        std::fs::write(&staged, text).map_err(|e| format!("{}: {e}", staged.display()))?;
        std::fs::rename(&staged, &job.file).map_err(|e| format!("{}: {e}", job.file.display()))?;
    }
    Ok(())
}

/// A label name as Prometheus makes it of a Kubernetes label or annotation name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

type Labels = BTreeMap<String, String>;

const META: &str = "__meta_kubernetes_";

/// `<role>_name`, and each label and annotation with its `…present` twin.
fn object_meta(
    labels: &mut Labels,
    role: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) {
    labels.insert(
        format!("{META}{role}_name"),
        meta.name.clone().unwrap_or_default(),
    );
    for (kind, map) in [("label", &meta.labels), ("annotation", &meta.annotations)] {
        for (k, v) in map.iter().flatten() {
            let k = sanitize(k);
            labels.insert(format!("{META}{role}_{kind}_{k}"), v.clone());
            labels.insert(format!("{META}{role}_{kind}present_{k}"), "true".into());
        }
    }
}

fn pod_labels(pod: &Pod) -> Labels {
    let status = pod.status.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.to_lowercase())
        .unwrap_or_else(|| "unknown".into());
    let mut labels = Labels::from([
        (
            format!("{META}pod_ip"),
            status.pod_ip.clone().unwrap_or_default(),
        ),
        (format!("{META}pod_ready"), ready),
        (
            format!("{META}pod_phase"),
            status.phase.clone().unwrap_or_default(),
        ),
        (
            format!("{META}pod_node_name"),
            spec.node_name.clone().unwrap_or_default(),
        ),
        (
            format!("{META}pod_host_ip"),
            status.host_ip.clone().unwrap_or_default(),
        ),
        (
            format!("{META}pod_uid"),
            pod.metadata.uid.clone().unwrap_or_default(),
        ),
    ]);
    object_meta(&mut labels, "pod", &pod.metadata);
    if let Some(owner) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    {
        labels.insert(format!("{META}pod_controller_kind"), owner.kind.clone());
        labels.insert(format!("{META}pod_controller_name"), owner.name.clone());
    }
    labels
}

/// The pod's containers then its init containers (Prometheus's order), each with whether it is
/// an init container.
fn containers(pod: &Pod) -> Vec<(&Container, bool)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .map(|c| (c, false))
        .chain(spec.init_containers.iter().flatten().map(|c| (c, true)))
        .collect()
}

/// The labels of container `c` of a pod: its name, image, and whether it is an init container.
fn container_labels(target: &mut Labels, c: &Container, init: bool) {
    target.insert(format!("{META}pod_container_name"), c.name.clone());
    target.insert(
        format!("{META}pod_container_image"),
        c.image.clone().unwrap_or_default(),
    );
    target.insert(format!("{META}pod_container_init"), init.to_string());
}

/// The labels of a container's port; the protocol is the endpoint's when an endpoint port
/// matched it (TCP when unset).
fn port_labels(target: &mut Labels, port: &ContainerPort, protocol: Option<String>) {
    target.insert(
        format!("{META}pod_container_port_name"),
        port.name.clone().unwrap_or_default(),
    );
    target.insert(
        format!("{META}pod_container_port_number"),
        port.container_port.to_string(),
    );
    target.insert(
        format!("{META}pod_container_port_protocol"),
        protocol.unwrap_or_else(|| "TCP".into()),
    );
}

fn group(labels: Labels) -> Value {
    let address = labels.get("__address__").cloned().unwrap_or_default();
    let labels: Map<String, Value> = labels
        .into_iter()
        .filter(|(k, _)| k != "__address__")
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    json!({"targets": [address], "labels": labels})
}

/// The pod role: per running pod with an IP, one target per container port (a container
/// without ports: one on the pod's IP).
pub fn pod_targets(pods: &[Pod]) -> Vec<Value> {
    let mut groups = Vec::new();
    for pod in pods {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let mut base = pod_labels(pod);
        base.insert(
            format!("{META}namespace"),
            pod.namespace().unwrap_or_default(),
        );
        let status = pod.status.clone().unwrap_or_default();
        for (c, init) in containers(pod) {
            let statuses = if init {
                status.init_container_statuses.clone()
            } else {
                status.container_statuses.clone()
            };
            let id = statuses
                .iter()
                .flatten()
                .find(|s| s.name == c.name)
                .and_then(|s| s.container_id.clone())
                .unwrap_or_default();
            let mut container = base.clone();
            container.insert(format!("{META}pod_container_id"), id);
            container_labels(&mut container, c, init);
            let ports = c.ports.clone().unwrap_or_default();
            if ports.is_empty() {
                container.insert("__address__".into(), ip.clone());
                groups.push(group(container));
                continue;
            }
            for port in ports {
                let mut target = container.clone();
                target.insert(
                    "__address__".into(),
                    format!("{ip}:{}", port.container_port),
                );
                port_labels(&mut target, &port, port.protocol.clone());
                groups.push(group(target));
            }
        }
    }
    groups
}

/// The endpoints role: per address and port of each Endpoints, with its Service's and pod's
/// labels; then each port of those pods that no endpoint port covers.
pub fn endpoints_targets(
    endpoints: &[Endpoints],
    services: &[Service],
    pods: &[Pod],
) -> Vec<Value> {
    let mut groups = Vec::new();
    for eps in endpoints {
        let ns = eps.namespace().unwrap_or_default();
        let mut base = Labels::from([(format!("{META}namespace"), ns.clone())]);
        if let Some(service) = services
            .iter()
            .find(|s| s.namespace().as_deref() == Some(&ns) && s.name_any() == eps.name_any())
        {
            object_meta(&mut base, "service", &service.metadata);
        }
        object_meta(&mut base, "endpoints", &eps.metadata);
        let mut seen: Vec<(&Pod, Vec<i32>)> = Vec::new();
        let mut targets: Vec<Labels> = Vec::new();
        for subset in eps.subsets.iter().flatten() {
            for port in subset.ports.iter().flatten() {
                let addresses = subset
                    .addresses
                    .iter()
                    .flatten()
                    .map(|a| (a, "true"))
                    .chain(
                        subset
                            .not_ready_addresses
                            .iter()
                            .flatten()
                            .map(|a| (a, "false")),
                    );
                for (address, ready) in addresses {
                    let mut target = base.clone();
                    target.insert(
                        "__address__".into(),
                        format!("{}:{}", address.ip, port.port),
                    );
                    target.insert(
                        format!("{META}endpoint_port_name"),
                        port.name.clone().unwrap_or_default(),
                    );
                    target.insert(
                        format!("{META}endpoint_port_protocol"),
                        port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    );
                    target.insert(format!("{META}endpoint_ready"), ready.into());
                    if let Some(r) = &address.target_ref {
                        target.insert(
                            format!("{META}endpoint_address_target_kind"),
                            r.kind.clone().unwrap_or_default(),
                        );
                        target.insert(
                            format!("{META}endpoint_address_target_name"),
                            r.name.clone().unwrap_or_default(),
                        );
                    }
                    if let Some(node) = &address.node_name {
                        target.insert(format!("{META}endpoint_node_name"), node.clone());
                    }
                    if let Some(host) = address.hostname.as_ref().filter(|h| !h.is_empty()) {
                        target.insert(format!("{META}endpoint_hostname"), host.clone());
                    }
                    let pod = address
                        .target_ref
                        .as_ref()
                        .filter(|r| r.kind.as_deref() == Some("Pod"))
                        .and_then(|r| {
                            let pod_ns = r.namespace.clone().unwrap_or_else(|| ns.clone());
                            pods.iter().find(|p| {
                                p.namespace().as_deref() == Some(&pod_ns)
                                    && Some(p.name_any()) == r.name
                            })
                        });
                    if let Some(pod) = pod {
                        target.extend(pod_labels(pod));
                        if let Some((c, init)) = containers(pod).into_iter().find(|(c, _)| {
                            c.ports
                                .iter()
                                .flatten()
                                .any(|cp| cp.container_port == port.port)
                        }) {
                            let cp = c
                                .ports
                                .iter()
                                .flatten()
                                .find(|cp| cp.container_port == port.port)
                                .expect("found");
                            container_labels(&mut target, c, init);
                            port_labels(&mut target, cp, port.protocol.clone());
                        }
                        match seen.iter_mut().find(|(p, _)| std::ptr::eq(*p, pod)) {
                            Some((_, ports)) => ports.push(port.port),
                            None => seen.push((pod, vec![port.port])),
                        }
                    }
                    // A not-ready address after a ready one of the same target overrides it.
                    targets.retain(|t| t.get("__address__") != target.get("__address__"));
                    targets.push(target);
                }
            }
        }
        for (pod, covered) in seen {
            let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                continue;
            };
            for (c, init) in containers(pod) {
                for cp in c
                    .ports
                    .iter()
                    .flatten()
                    .filter(|cp| !covered.contains(&cp.container_port))
                {
                    let mut target = base.clone();
                    target.extend(pod_labels(pod));
                    target.insert("__address__".into(), format!("{ip}:{}", cp.container_port));
                    container_labels(&mut target, c, init);
                    port_labels(&mut target, cp, cp.protocol.clone());
                    targets.push(target);
                }
            }
        }
        groups.extend(targets.into_iter().map(group));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-0", "namespace": "ns", "uid": "u1",
                "labels": {"app.kubernetes.io/name": "cdncluster"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs", "uid": "r", "controller": true}],
            },
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "nginx", "image": "nginx:1", "ports": [{"name": "http", "containerPort": 8080}]}],
                "initContainers": [{"name": "metrics", "image": "op:1", "restartPolicy": "Always", "ports": [{"name": "metrics", "containerPort": 9113}]}],
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.5", "hostIP": "10.88.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "nginx", "containerID": "containerd://abc", "image": "nginx:1", "imageID": "", "ready": true, "restartCount": 0}],
                "initContainerStatuses": [{"name": "metrics", "containerID": "containerd://def", "image": "op:1", "imageID": "", "ready": true, "restartCount": 0}],
            },
        }))
        .unwrap()
    }

    fn labels(group: &Value) -> BTreeMap<String, String> {
        let mut l: BTreeMap<String, String> =
            serde_json::from_value(group["labels"].clone()).unwrap();
        l.insert(
            "__address__".into(),
            group["targets"][0].as_str().unwrap().into(),
        );
        l
    }

    #[test]
    fn the_pod_role_gives_each_container_port_init_containers_included() {
        let groups = pod_targets(&[pod()]);
        assert_eq!(groups.len(), 2);
        let sidecar = labels(&groups[1]);
        for (k, v) in [
            ("__address__", "10.0.0.5:9113"),
            ("__meta_kubernetes_namespace", "ns"),
            ("__meta_kubernetes_pod_name", "web-0"),
            (
                "__meta_kubernetes_pod_label_app_kubernetes_io_name",
                "cdncluster",
            ),
            (
                "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name",
                "true",
            ),
            ("__meta_kubernetes_pod_container_name", "metrics"),
            ("__meta_kubernetes_pod_container_id", "containerd://def"),
            ("__meta_kubernetes_pod_container_init", "true"),
            ("__meta_kubernetes_pod_container_port_name", "metrics"),
            ("__meta_kubernetes_pod_container_port_number", "9113"),
            ("__meta_kubernetes_pod_container_port_protocol", "TCP"),
            ("__meta_kubernetes_pod_phase", "Running"),
            ("__meta_kubernetes_pod_ready", "true"),
            ("__meta_kubernetes_pod_controller_kind", "ReplicaSet"),
            ("__meta_kubernetes_pod_controller_name", "web-rs"),
        ] {
            assert_eq!(
                sidecar.get(k).map(String::as_str),
                Some(v),
                "{k}: {sidecar:?}"
            );
        }
        assert_eq!(
            labels(&groups[0])["__meta_kubernetes_pod_container_init"],
            "false"
        );
    }

    #[test]
    fn the_endpoints_role_joins_the_service_and_the_pod_and_adds_the_pods_other_ports() {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "labels": {"app.kubernetes.io/component": "metrics"}},
        }))
        .unwrap();
        let endpoints: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "subsets": [{
                "addresses": [{"ip": "10.0.0.5", "nodeName": "n1", "targetRef": {"kind": "Pod", "name": "web-0", "namespace": "ns"}}],
                "ports": [{"name": "metrics", "port": 9113, "protocol": "TCP"}],
            }],
        }))
        .unwrap();
        let groups = endpoints_targets(&[endpoints], &[service], &[pod()]);
        assert_eq!(groups.len(), 2, "{groups:#?}");
        let first = labels(&groups[0]);
        for (k, v) in [
            ("__address__", "10.0.0.5:9113"),
            ("__meta_kubernetes_service_name", "web"),
            (
                "__meta_kubernetes_service_label_app_kubernetes_io_component",
                "metrics",
            ),
            (
                "__meta_kubernetes_service_labelpresent_app_kubernetes_io_component",
                "true",
            ),
            ("__meta_kubernetes_endpoints_name", "web"),
            ("__meta_kubernetes_endpoint_port_name", "metrics"),
            ("__meta_kubernetes_endpoint_ready", "true"),
            ("__meta_kubernetes_endpoint_address_target_kind", "Pod"),
            ("__meta_kubernetes_endpoint_address_target_name", "web-0"),
            ("__meta_kubernetes_endpoint_node_name", "n1"),
            ("__meta_kubernetes_pod_name", "web-0"),
            ("__meta_kubernetes_pod_container_name", "metrics"),
            ("__meta_kubernetes_pod_container_init", "true"),
        ] {
            assert_eq!(first.get(k).map(String::as_str), Some(v), "{k}: {first:?}");
        }
        // nginx's port, which the Service does not name: a target of its own, without endpoint
        // labels, as Prometheus adds it.
        let other = labels(&groups[1]);
        assert_eq!(other["__address__"], "10.0.0.5:8080");
        assert!(!other.contains_key("__meta_kubernetes_endpoint_port_name"));
        assert_eq!(other["__meta_kubernetes_service_name"], "web");
    }

    #[test]
    fn kubernetes_sd_becomes_a_file_and_what_is_not_modelled_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut configs = vec![json!({
            "job_name": "serviceMonitor/ns/web/0",
            "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": ["ns"]}, "kubeconfig_file": "/k"}],
            "relabel_configs": [],
        })];
        let jobs = file_sd(&mut configs, dir.path()).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].role, Role::Endpoints);
        assert_eq!(jobs[0].namespaces, vec!["ns".to_string()]);
        assert!(configs[0].get("kubernetes_sd_configs").is_none());
        assert_eq!(
            configs[0]["file_sd_configs"][0]["files"][0],
            jobs[0].file.display().to_string()
        );
        let mut selectors = vec![json!({
            "job_name": "j",
            "kubernetes_sd_configs": [{"role": "pod", "selectors": [{"role": "pod", "label": "a=b"}]}],
        })];
        let error = file_sd(&mut selectors, dir.path()).unwrap_err();
        assert!(error.contains("selectors is not modelled"), "{error}");
    }
}
