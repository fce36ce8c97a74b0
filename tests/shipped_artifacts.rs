//! The manifests users install (kustomize/, helm/, bundle/, olm/, argocd/) agree with the code and
//! with each other: CRD copies, RBAC, the operator Deployment, the OLM catalog, and the metrics the
//! dashboard and the alerts query. The real validators run in scripts/check-artifacts.sh.

use cdn_operator::api::{crds, crds_yaml, CdnCluster, CdnClusterSpec, Phase, Role, State};
use cdn_operator::cdncluster::build;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    let full = root().join(path);
    fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {}: {e}", full.display()))
}

/// Every YAML document of a file, as JSON values (empty documents skipped).
fn yaml_docs(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{path}: bad YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml(path: &str) -> Value {
    let mut docs = yaml_docs(path);
    assert_eq!(docs.len(), 1, "{path}: expected one YAML document");
    docs.remove(0)
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v}"))
}

const CRD_COPIES: [&str; 3] = [
    "kustomize/base/crds",
    "helm/cdn-operator/files/crds",
    "bundle/manifests",
];

/// The file each CRD is shipped as: `<group>_<plural>.yaml`, as OLM bundles name them.
fn crd_files() -> Vec<(String, String)> {
    crds()
        .iter()
        .map(|crd| {
            let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            (file, serde_yaml::to_string(crd).expect("a CRD serializes"))
        })
        .collect()
}

#[test]
fn every_crd_copy_is_the_generated_crd() {
    let expected = crd_files();
    assert_eq!(expected.len(), 3, "CdnCluster, CdnPurge and At");
    // The split files put together are exactly what `cdn-operator crd` prints.
    let joined: Vec<&str> = expected.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(joined.join("---\n"), crds_yaml());
    for dir in CRD_COPIES {
        for (file, text) in &expected {
            let path = format!("{dir}/{file}");
            assert!(
                read(&path) == *text,
                "{path} differs from the CRD generated from src/api/: run scripts/sync-crds.sh"
            );
        }
        // No stale copy of a renamed or removed CRD.
        let shipped: BTreeSet<String> = fs::read_dir(root().join(dir))
            .expect("CRD directory")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|name| {
                let kind = yaml_kind(&format!("{dir}/{name}"));
                kind.as_deref() == Some("CustomResourceDefinition")
            })
            .collect();
        let wanted: BTreeSet<String> = expected.iter().map(|(f, _)| f.clone()).collect();
        assert_eq!(shipped, wanted, "CRD files in {dir}");
    }
    // kustomize installs each of them.
    let kustomization = yaml("kustomize/base/kustomization.yaml");
    let resources: Vec<&str> = kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for (file, _) in &expected {
        assert!(
            resources.contains(&format!("crds/{file}").as_str()),
            "kustomize/base does not install crds/{file}"
        );
    }
}

fn yaml_kind(path: &str) -> Option<String> {
    if !path.ends_with(".yaml") {
        return None;
    }
    yaml_docs(path)
        .first()
        .and_then(|d| d["kind"].as_str().map(str::to_string))
}

#[test]
fn copies_for_helm_and_olm_are_byte_copies_of_the_kustomize_sources() {
    for (source, copy) in [
        (
            "kustomize/components/grafana-dashboards/cdn-operator.json",
            "helm/cdn-operator/files/dashboards/cdn-operator.json",
        ),
        (
            CDN_DASHBOARD,
            "helm/cdn-operator/files/dashboards/cdn-clusters.json",
        ),
        (
            "kustomize/components/prometheus/prometheus_rule.yaml",
            "helm/cdn-operator/files/prometheus_rule.yaml",
        ),
        // OLM installs these bundle objects as they are (bundle_holds_what_olm_installs).
        (
            "kustomize/base/pod_disruption_budget.yaml",
            "bundle/manifests/cdn-operator.poddisruptionbudget.yaml",
        ),
        (
            "kustomize/base/purge_signing_secret.yaml",
            "bundle/manifests/cdn-operator-purge-signing.secret.yaml",
        ),
        // Monitoring of OLM installs, applied by hand (olm/monitoring).
        (
            "kustomize/components/prometheus/prometheus_rule.yaml",
            "olm/monitoring/prometheus-operator/prometheus_rule.yaml",
        ),
        (
            "kustomize/components/prometheus/pod_monitor.yaml",
            "olm/monitoring/prometheus-operator/pod_monitor.yaml",
        ),
    ] {
        assert!(
            read(source) == read(copy),
            "{copy} differs from {source}: run scripts/sync-crds.sh"
        );
    }
    // The bundle's metrics Service is kustomize's plus OpenShift's serving-certificate request
    // (olm/monitoring/openshift verifies that certificate), as scripts/sync-crds.sh writes it.
    let service = read("kustomize/base/metrics_service.yaml");
    let annotated = service.replacen(
        "\n  labels:\n",
        "\n  annotations:\n    # OpenShift's service CA writes a certificate for this Service into this Secret (inert\n    \
         # elsewhere); olm/monitoring/openshift scrapes with it (docs/install.md, OLM).\n    \
         service.beta.openshift.io/serving-cert-secret-name: cdn-operator-metrics-cert\n  labels:\n",
        1,
    );
    assert!(
        annotated != service
            && annotated == read("bundle/manifests/cdn-operator-metrics.service.yaml"),
        "bundle/manifests/cdn-operator-metrics.service.yaml is not kustomize/base/metrics_service.yaml \
         with the serving-cert annotation: run scripts/sync-crds.sh"
    );
}

/// One permission: (apiGroup, resource, resourceName or "", verb). Rules are compared as sets of
/// these, so that grouping rules differently does not matter but any extra right does.
type Grant = (String, String, String, String);

fn grants(rules: &Value) -> BTreeSet<Grant> {
    let list = |v: &Value, key: &str| -> Vec<String> {
        v.get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().expect("RBAC strings").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for rule in rules.as_array().expect("rules is a list") {
        let names = list(rule, "resourceNames");
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for group in list(rule, "apiGroups") {
            for resource in list(rule, "resources") {
                for name in &names {
                    for verb in list(rule, "verbs") {
                        out.insert((group.clone(), resource.clone(), name.clone(), verb));
                    }
                }
            }
        }
    }
    out
}

fn grant(group: &str, resource: &str, name: &str, verb: &str) -> Grant {
    (group.into(), resource.into(), name.into(), verb.into())
}

/// Exactly what the operator does against the API, no more (see the comments in
/// kustomize/base/cluster_role.yaml for the code path of each).
fn expected_cluster_grants() -> BTreeSet<Grant> {
    let mut g = BTreeSet::new();
    for (group, kind) in [
        ("cluster.anevia.com", "cdnclusters"),
        ("cnat.programming-kubernetes.info", "ats"),
    ] {
        g.insert(grant(group, kind, "", "list"));
        g.insert(grant(group, kind, "", "watch"));
        g.insert(grant(group, &format!("{kind}/status"), "", "patch"));
        g.insert(grant(group, &format!("{kind}/finalizers"), "", "update"));
    }
    for (group, resource) in [
        ("apps", "deployments"),
        ("", "configmaps"),
        ("", "services"),
        ("", "pods"),
    ] {
        for verb in ["list", "watch", "create", "patch"] {
            g.insert(grant(group, resource, "", verb));
        }
    }
    // src/cdncluster/mod.rs apply_service: a Service whose clusterIP must change is created
    // again.
    g.insert(grant("", "services", "", "delete"));
    // src/cdncluster/children.rs apply_workload: a cache with a volume runs in a StatefulSet;
    // the workload of the other kind is deleted once the new one's pods are ready.
    for verb in ["list", "watch", "create", "patch", "delete"] {
        g.insert(grant("apps", "statefulsets", "", verb));
    }
    g.insert(grant("apps", "deployments", "", "delete"));
    // src/cdncluster/children.rs apply_budget: a cluster with more than one replica has a
    // PodDisruptionBudget, deleted when it scales down to one.
    for verb in ["list", "watch", "create", "patch", "delete"] {
        g.insert(grant("policy", "poddisruptionbudgets", "", verb));
        // The Ingress a balancer's spec asks for, deleted when it no longer does.
        g.insert(grant("networking.k8s.io", "ingresses", "", verb));
    }
    // src/at/mod.rs reads the At fresh before writing its status.
    g.insert(grant("cnat.programming-kubernetes.info", "ats", "", "get"));
    // src/purge/mod.rs: CdnPurges watched (no get), their status applied; no finalizers (a
    // purge owns no object).
    g.insert(grant("cluster.anevia.com", "cdnpurges", "", "list"));
    g.insert(grant("cluster.anevia.com", "cdnpurges", "", "watch"));
    g.insert(grant("cluster.anevia.com", "cdnpurges/status", "", "patch"));
    g.insert(grant("events.k8s.io", "events", "", "create"));
    g.insert(grant("events.k8s.io", "events", "", "patch"));
    g
}

/// The secured /metrics (runtime/src/access.rs): a TokenReview and a SubjectAccessReview per
/// new caller. Cluster-scoped, so a ClusterRole of its own that single-namespace mode keeps.
fn expected_metrics_auth_grants() -> BTreeSet<Grant> {
    [
        grant("authentication.k8s.io", "tokenreviews", "", "create"),
        grant("authorization.k8s.io", "subjectaccessreviews", "", "create"),
    ]
    .into()
}

fn expected_lease_grants() -> BTreeSet<Grant> {
    [
        grant("coordination.k8s.io", "leases", "", "create"),
        grant(
            "coordination.k8s.io",
            "leases",
            "cdn-operator-leader",
            "get",
        ),
        grant(
            "coordination.k8s.io",
            "leases",
            "cdn-operator-leader",
            "patch",
        ),
    ]
    .into()
}

/// src/purge/signing.rs: the purge key's Secret, read and filled once; only that one, by name, and
/// never create (create + get would let a stolen token mint a ServiceAccount token Secret and
/// read it back).
fn expected_purge_signing_grants() -> BTreeSet<Grant> {
    let name = cdn_operator::purge::signing::SECRET_NAME;
    [
        grant("", "secrets", name, "get"),
        grant("", "secrets", name, "patch"),
    ]
    .into()
}

#[test]
fn rbac_is_exactly_what_the_operator_uses() {
    let cluster_role = yaml("kustomize/base/cluster_role.yaml");
    assert_eq!(cluster_role["kind"], "ClusterRole");
    assert_eq!(grants(&cluster_role["rules"]), expected_cluster_grants());

    let lease_role = yaml("kustomize/base/leader_election_role.yaml");
    // A Role: Leases only in the operator's own namespace.
    assert_eq!(lease_role["kind"], "Role");
    assert_eq!(grants(&lease_role["rules"]), expected_lease_grants());

    // A Role: the purge key's Secret only in the operator's own namespace, bound to its account.
    let signing_role = yaml("kustomize/base/purge_signing_role.yaml");
    assert_eq!(signing_role["kind"], "Role");
    assert_eq!(
        grants(&signing_role["rules"]),
        expected_purge_signing_grants()
    );
    let signing_binding = yaml("kustomize/base/purge_signing_role_binding.yaml");
    assert_eq!(
        signing_binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": signing_role["metadata"]["name"]})
    );
    assert_eq!(
        signing_binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "cdn-operator"}])
    );
    // The Secret the operator may not create is shipped, empty: the operator fills it, and no
    // re-apply of the install carries a `data` that would replace the key.
    let secret = yaml("kustomize/base/purge_signing_secret.yaml");
    assert_eq!(secret["kind"], "Secret");
    assert_eq!(
        secret["metadata"]["name"],
        cdn_operator::purge::signing::SECRET_NAME
    );
    assert_eq!(secret["type"], "Opaque");
    for field in ["data", "stringData", "immutable"] {
        assert!(
            secret.get(field).is_none(),
            "the shipped Secret has {field}"
        );
    }
    let kustomization = yaml("kustomize/base/kustomization.yaml");
    for file in [
        "purge_signing_role.yaml",
        "purge_signing_role_binding.yaml",
        "purge_signing_secret.yaml",
    ] {
        assert!(
            kustomization["resources"]
                .as_array()
                .unwrap()
                .contains(&json!(file)),
            "kustomize/base does not install {file}"
        );
    }

    let metrics_auth = yaml("kustomize/base/metrics_auth_role.yaml");
    assert_eq!(metrics_auth["kind"], "ClusterRole");
    assert_eq!(
        grants(&metrics_auth["rules"]),
        expected_metrics_auth_grants()
    );
    let binding = yaml("kustomize/base/metrics_auth_role_binding.yaml");
    assert_eq!(binding["roleRef"]["name"], metrics_auth["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "cdn-operator"}])
    );
    // What scrapers are bound to: get on /metrics, nothing else; the same in the bundle.
    let reader = yaml("kustomize/base/metrics_reader_role.yaml");
    assert_eq!(reader["kind"], "ClusterRole");
    assert_eq!(
        reader["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let bundled = yaml("bundle/manifests/cdn-operator-metrics-reader.clusterrole.yaml");
    assert_eq!(bundled["metadata"], reader["metadata"]);
    assert_eq!(bundled["rules"], reader["rules"]);

    for g in expected_cluster_grants()
        .iter()
        .chain(&expected_lease_grants())
        .chain(&expected_metrics_auth_grants())
    {
        assert!(!g.0.contains('*') && !g.1.contains('*') && !g.3.contains('*'));
        assert_ne!(g.1, "secrets");
    }
    for g in expected_purge_signing_grants() {
        assert!(!g.2.is_empty() && g.3 != "create" && g.3 != "list" && g.3 != "watch");
    }
    // The Deployment's --leader-election-id is the Lease the Role allows.
    let deployment = yaml("kustomize/base/deployment.yaml");
    let args = deployment
        .pointer("/spec/template/spec/containers/0/args")
        .expect("args");
    assert!(args
        .as_array()
        .unwrap()
        .contains(&json!("--leader-election-id=cdn-operator-leader")));
}

/// The built-in roles (admin, edit, view) a ClusterRole is aggregated into.
fn aggregated_into(role: &Value) -> BTreeSet<String> {
    role["metadata"]["labels"]
        .as_object()
        .map(|labels| {
            labels
                .iter()
                .filter(|(_, v)| *v == "true")
                .filter_map(|(k, _)| k.strip_prefix("rbac.authorization.k8s.io/aggregate-to-"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn users_roles_keep_purging_apart_from_editing() {
    let g = "cluster.anevia.com";
    let verbs = |resource: &str, verbs: &[&str]| -> BTreeSet<Grant> {
        verbs.iter().map(|v| grant(g, resource, "", v)).collect()
    };
    let mut cluster_editor = verbs(
        "cdnclusters",
        &[
            "create", "get", "list", "watch", "update", "patch", "delete",
        ],
    );
    cluster_editor.extend(verbs("cdnclusters/status", &["get"]));
    cluster_editor.extend(verbs("cdnclusters/scale", &["get", "update", "patch"]));
    let mut purge_editor = verbs("cdnpurges", &["create", "get", "list", "watch", "delete"]);
    purge_editor.extend(verbs("cdnpurges/status", &["get"]));
    let readers = ["admin", "edit", "view"];
    for (file, name, want, into) in [
        (
            "cdncluster_editor_role.yaml",
            "cdn-operator-cdncluster-editor",
            cluster_editor,
            &readers[..2],
        ),
        (
            "cdncluster_viewer_role.yaml",
            "cdn-operator-cdncluster-viewer",
            verbs("cdnclusters", &["get", "list", "watch"]),
            &readers[..],
        ),
        // Who may purge is not who may edit a CdnCluster: admin only, never edit.
        (
            "cdnpurge_editor_role.yaml",
            "cdn-operator-cdnpurge-editor",
            purge_editor,
            &readers[..1],
        ),
        (
            "cdnpurge_viewer_role.yaml",
            "cdn-operator-cdnpurge-viewer",
            verbs("cdnpurges", &["get", "list", "watch"]),
            &readers[..],
        ),
    ] {
        let path = format!("kustomize/base/{file}");
        let role = yaml(&path);
        assert_eq!(role["kind"], "ClusterRole", "{path}");
        assert_eq!(role["metadata"]["name"], name, "{path}");
        assert_eq!(grants(&role["rules"]), want, "{path}");
        let into: BTreeSet<String> = into.iter().map(|r| r.to_string()).collect();
        assert_eq!(aggregated_into(&role), into, "{path}: aggregated into");
        assert!(
            yaml("kustomize/base/kustomization.yaml")["resources"]
                .as_array()
                .unwrap()
                .contains(&json!(file)),
            "kustomize/base does not install {file}"
        );
    }
    // Nothing the install binds refers to them: they grant the operator nothing.
    for entry in fs::read_dir(root().join("kustomize/base")).expect("kustomize/base") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with("binding.yaml") {
            let binding = yaml(&format!("kustomize/base/{name}"));
            let role = str_at(&binding, "/roleRef/name");
            assert!(
                !role.contains("-editor") && !role.contains("-viewer"),
                "{name}"
            );
        }
    }
}

/// The container port named `name` in a Deployment spec.
fn container_port(deployment_spec: &Value, name: &str) -> u64 {
    deployment_spec
        .pointer("/template/spec/containers/0/ports")
        .and_then(Value::as_array)
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

#[test]
fn metrics_are_scraped_over_https_on_the_port_the_operator_serves() {
    let deployment = yaml("kustomize/base/deployment.yaml");
    let args = deployment
        .pointer("/spec/template/spec/containers/0/args")
        .and_then(Value::as_array)
        .expect("args");
    // Secure metrics are the operator's default; no install path turns them off.
    assert!(
        !args
            .iter()
            .any(|a| a.as_str().unwrap().starts_with("--metrics-secure")),
        "{args:?}"
    );
    let bind = args
        .iter()
        .find_map(|a| a.as_str().unwrap().strip_prefix("--metrics-bind-address=:"))
        .expect("--metrics-bind-address");
    let port = container_port(&deployment["spec"], "metrics");
    assert_eq!(bind, port.to_string());
    assert_eq!(port, 8443, "controller-runtime's secure metrics port");
    let service = yaml("kustomize/base/metrics_service.yaml");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}])
    );
    let monitor = yaml("kustomize/components/prometheus/service_monitor.yaml");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(
        endpoint["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    assert_eq!(endpoint["tlsConfig"], json!({"insecureSkipVerify": true}));
    // The NetworkPolicy lets in the metrics and probe ports, by the names the Deployment gives.
    let policy = yaml("kustomize/components/network-policy/network_policy.yaml");
    let ingress: Vec<&str> = policy["spec"]["ingress"][0]["ports"]
        .as_array()
        .expect("ingress ports")
        .iter()
        .map(|p| p["port"].as_str().expect("a named port"))
        .collect();
    assert_eq!(ingress, ["metrics", "health"]);
    container_port(&deployment["spec"], "health");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    // It lets the operator out to the nginx pods' sidecars, which purges are sent to: their port,
    // on the labels every nginx pod carries, in every namespace.
    let nginx_pods = json!({
        build::MANAGED_BY_LABEL: build::MANAGED_BY,
        "app.kubernetes.io/name": "cdncluster",
    });
    let to_sidecars = policy["spec"]["egress"]
        .as_array()
        .expect("egress")
        .iter()
        .find(|rule| rule["to"][0]["podSelector"]["matchLabels"] == nginx_pods)
        .expect("an egress rule to the nginx pods");
    assert_eq!(to_sidecars["to"][0]["namespaceSelector"], json!({}));
    assert_eq!(
        to_sidecars["ports"],
        json!([{"port": cdn_operator::nginx_metrics::PORT, "protocol": "TCP"}])
    );
}

fn csv() -> Value {
    yaml("bundle/manifests/cdn-operator.clusterserviceversion.yaml")
}

#[test]
fn csv_permissions_equal_the_rbac() {
    let csv = csv();
    let strategy = &csv["spec"]["install"]["spec"];
    // `permissions`: OLM turns them into Roles of the target namespaces, or ClusterRoles when the
    // OperatorGroup targets all namespaces. `clusterPermissions`: the metrics reviews only.
    let cluster = strategy["clusterPermissions"]
        .as_array()
        .expect("clusterPermissions");
    assert_eq!(cluster.len(), 1);
    assert_eq!(cluster[0]["serviceAccountName"], "cdn-operator");
    assert_eq!(
        grants(&cluster[0]["rules"]),
        grants(&yaml("kustomize/base/metrics_auth_role.yaml")["rules"])
    );
    let permissions = strategy["permissions"].as_array().expect("permissions");
    assert_eq!(permissions.len(), 1);
    assert_eq!(permissions[0]["serviceAccountName"], "cdn-operator");
    let mut shipped = grants(&yaml("kustomize/base/cluster_role.yaml")["rules"]);
    for role in [
        "kustomize/base/leader_election_role.yaml",
        "kustomize/base/purge_signing_role.yaml",
    ] {
        shipped.extend(grants(&yaml(role)["rules"]));
    }
    assert_eq!(grants(&permissions[0]["rules"]), shipped);
}

#[test]
fn csv_deployment_is_the_kustomize_deployment_with_olm_namespaces() {
    let csv = csv();
    let deployments = csv["spec"]["install"]["spec"]["deployments"]
        .as_array()
        .expect("deployments");
    assert_eq!(deployments.len(), 1);
    let mut want = yaml("kustomize/base/deployment.yaml")["spec"].clone();
    let image = kustomize_image();
    let container = want
        .pointer_mut("/template/spec/containers/0")
        .expect("container");
    container["image"] = json!(image);
    // What kustomize/base's replacement does: the metrics sidecar's image is the operator's.
    let env = container["env"].as_array_mut().expect("env");
    let sidecar = env
        .iter_mut()
        .find(|e| e["name"] == NGINX_METRICS_ENV)
        .expect("RELATED_IMAGE_NGINX_METRICS");
    sidecar["value"] = json!(image);
    env.push(json!({
        "name": "WATCH_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['olm.targetNamespaces']"}}
    }));
    assert_eq!(deployments[0]["spec"], want);
    assert_eq!(
        str_at(&csv, "/metadata/annotations/containerImage"),
        image,
        "containerImage"
    );
    let related: Vec<&str> = csv["spec"]["relatedImages"]
        .as_array()
        .expect("relatedImages")
        .iter()
        .map(|i| str_at(i, "/image"))
        .collect();
    assert!(related.contains(&image.as_str()));
    // Mirrors for disconnected clusters need the operands' default images too.
    assert!(
        related.contains(&cdn_operator::cdncluster::build::DEFAULT_IMAGE),
        "relatedImages lacks the default nginx image"
    );
    // The nginx pods' default image, which a release pins by digest: the operator takes it from
    // the env (a mirror serves the digest of relatedImages, not the tag compiled in).
    assert!(
        csv["spec"]["relatedImages"].as_array().unwrap().contains(
            &json!({"name": "nginx", "image": cdn_operator::cdncluster::build::DEFAULT_IMAGE})
        ),
        "relatedImages lacks nginx"
    );
    assert_eq!(
        env_value(
            &deployments[0]["spec"]["template"]["spec"],
            "RELATED_IMAGE_NGINX"
        ),
        Some(&json!(cdn_operator::cdncluster::build::DEFAULT_IMAGE)),
        "the CSV's RELATED_IMAGE_NGINX"
    );
    // The metrics sidecar's image, by the name OLM's convention derives from the env.
    assert!(
        csv["spec"]["relatedImages"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "nginx-metrics", "image": image})),
        "relatedImages lacks nginx-metrics"
    );
}

// ----- the nginx pods' metrics sidecar (docs/cdn-metrics.txt) ---------------------------------

/// The operator's env naming the image of the nginx pods' `metrics` sidecar (--nginx-metrics-image).
const NGINX_METRICS_ENV: &str = "RELATED_IMAGE_NGINX_METRICS";

/// The `value` of env `name` of the first container of a pod spec (None: no such env).
fn env_value<'a>(pod_spec: &'a Value, name: &str) -> Option<&'a Value> {
    pod_spec["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| &e["value"])
}

#[test]
fn every_install_path_runs_the_metrics_sidecar_from_the_operator_image() {
    // kustomize: the env, and a replacement copying the operator container's image into it
    // (after `images:`, so `kustomize edit set image` moves both; scripts/check-artifacts.sh
    // builds it).
    let deployment = yaml("kustomize/base/deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["name"], "operator");
    assert!(
        env_value(pod, NGINX_METRICS_ENV).is_some(),
        "no {NGINX_METRICS_ENV}"
    );
    let kustomization = yaml("kustomize/base/kustomization.yaml");
    let replacement = json!({
        "source": {
            "kind": "Deployment",
            "name": "cdn-operator",
            "fieldPath": "spec.template.spec.containers.[name=operator].image"
        },
        "targets": [{
            "select": {"kind": "Deployment", "name": "cdn-operator"},
            "fieldPaths": [format!(
                "spec.template.spec.containers.[name=operator].env.[name={NGINX_METRICS_ENV}].value"
            )]
        }]
    });
    assert_eq!(kustomization["replacements"], json!([replacement]));
    // docs/install.md gives the same entry for overlays that set the image themselves.
    let docs = read("docs/install.md");
    let snippet = docs
        .split("```yaml\n")
        .find_map(|block| block.strip_prefix("replacements:\n"))
        .and_then(|block| block.split("```").next())
        .expect("docs/install.md: the replacements snippet");
    let documented: Value =
        serde_yaml::from_str(&format!("replacements:\n{snippet}")).expect("snippet");
    assert_eq!(documented["replacements"], json!([replacement]));
    // OLM: the CSV's env is the operator's image (csv_deployment_is_the_kustomize_deployment_…
    // checks relatedImages).
    let csv = csv();
    let pod = &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"];
    assert_eq!(
        env_value(pod, NGINX_METRICS_ENV),
        Some(&pod["containers"][0]["image"])
    );
    // Helm: on by default, following the operator's image (rendered and checked in
    // scripts/check-artifacts.sh).
    let values = yaml("helm/cdn-operator/values.yaml");
    assert_eq!(values["cdnMetrics"]["enabled"], true);
    assert_eq!(values["cdnMetrics"]["image"], "");
}

#[test]
fn the_pod_monitor_scrapes_the_metrics_port_of_every_nginx_pod() {
    let monitor = yaml("kustomize/components/prometheus/pod_monitor.yaml");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["kind"], "PodMonitor");
    // It selects the pods of every CdnCluster, whatever its role or name, by labels the operator
    // sets on each.
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert_eq!(
        selector.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        BTreeSet::from(["app.kubernetes.io/managed-by", "app.kubernetes.io/name"])
    );
    for role in [Role::Balancer, Role::Cache] {
        let cluster = CdnCluster::new("edge", CdnClusterSpec::new(role, vec![]));
        let labels = build::labels(&cluster);
        for (key, value) in selector {
            assert_eq!(labels.get(key).map(String::as_str), value.as_str(), "{key}");
        }
    }
    // The sidecar's port and path (docs/cdn-metrics.txt); job="cdncluster".
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"],
        json!([{"port": "metrics", "path": "/metrics", "interval": "30s"}])
    );
    // ... which every pod the operator builds serves: its sidecar's port of that name.
    let sidecar = build::PodSettings {
        images: build::PodImages {
            metrics: Some("cdn-operator".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    for role in [Role::Balancer, Role::Cache] {
        let cluster = CdnCluster::new("edge", CdnClusterSpec::new(role, vec![]));
        let pod = build::children(&cluster, &[], &Default::default(), &sidecar)
            .workload
            .template()
            .spec
            .clone()
            .unwrap();
        let ports: Vec<_> = pod.init_containers.unwrap()[0]
            .ports
            .clone()
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.container_port))
            .collect();
        assert_eq!(ports, [("metrics".to_string(), 9113)]);
    }
    assert_eq!(monitor["spec"]["jobLabel"], "app.kubernetes.io/name");
    assert_eq!(monitor["spec"]["namespaceSelector"], json!({"any": true}));
    // kube-prometheus-stack selects it as it selects the operator's ServiceMonitor.
    let service_monitor = yaml("kustomize/components/prometheus/service_monitor.yaml");
    assert_eq!(
        monitor["metadata"]["labels"],
        service_monitor["metadata"]["labels"]
    );
    let component = yaml("kustomize/components/prometheus/kustomization.yaml");
    assert!(component["resources"]
        .as_array()
        .expect("resources")
        .contains(&json!("pod_monitor.yaml")));
    // Single-namespace mode narrows it to the install's own namespace (checked built in
    // scripts/check-artifacts.sh).
    let single = yaml("kustomize/components/single-namespace/kustomization.yaml");
    assert!(single["patches"]
        .as_array()
        .expect("patches")
        .iter()
        .any(|p| p["target"]
            == json!({"kind": "PodMonitor", "name": str_at(&monitor, "/metadata/name")})));
    // OLM does not install a PodMonitor from a bundle (bundle_holds_what_olm_installs refuses
    // one there): olm/monitoring holds a copy (copies_for_helm_and_olm...) that users apply.
    assert!(!OLM_BUNDLE_KINDS.contains(&"PodMonitor"));
    let olm = yaml("olm/monitoring/prometheus-operator/kustomization.yaml");
    assert!(olm["resources"]
        .as_array()
        .expect("resources")
        .contains(&json!("pod_monitor.yaml")));
}

/// The operator image kustomize/base deploys (its `images:` entry).
fn kustomize_image() -> String {
    let k = yaml("kustomize/base/kustomization.yaml");
    let image = &k["images"][0];
    format!("{}:{}", str_at(image, "/newName"), str_at(image, "/newTag"))
}

#[test]
fn versions_and_images_agree_across_installers() {
    let csv = csv();
    let version = str_at(&csv, "/spec/version").to_string();
    assert_eq!(
        str_at(&csv, "/metadata/name"),
        format!("cdn-operator.v{version}")
    );
    assert_eq!(version, cdn_operator::VERSION, "CSV version is the crate's");
    let chart = yaml("helm/cdn-operator/Chart.yaml");
    assert_eq!(str_at(&chart, "/appVersion"), version);
    let values = yaml("helm/cdn-operator/values.yaml");
    // The chart composes <registry>/<repository> (global.imageRegistry replaces the registry).
    assert_eq!(
        format!(
            "{}/{}:{}",
            str_at(&values, "/image/registry"),
            str_at(&values, "/image/repository"),
            version
        ),
        kustomize_image()
    );
    assert_eq!(
        kustomize_image(),
        format!("ghcr.io/anevia/cdn-operator:{version}")
    );
}

/// The properties of the CRD schema at `path` (a dotted path under spec or status).
fn schema_has(schema: &Value, path: &str) -> bool {
    let mut node = schema;
    for part in path.split('.') {
        match node.pointer(&format!("/properties/{part}")) {
            Some(next) => node = next,
            None => return false,
        }
    }
    true
}

#[test]
fn csv_owns_the_crds_with_descriptors_that_exist() {
    let csv = csv();
    let owned = csv["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .expect("owned CRDs");
    let generated = crds();
    assert_eq!(owned.len(), generated.len());
    for crd in &generated {
        let version = &crd.spec.versions[0];
        let entry = owned
            .iter()
            .find(|o| o["name"] == json!(crd.metadata.name.clone().unwrap()))
            .unwrap_or_else(|| panic!("{:?} not owned by the CSV", crd.metadata.name));
        assert_eq!(entry["kind"], json!(crd.spec.names.kind));
        assert_eq!(entry["version"], json!(version.name));
        let schema = serde_json::to_value(
            version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("schema"),
        )
        .unwrap();
        for (descriptors, under) in [("specDescriptors", "spec"), ("statusDescriptors", "status")] {
            let list = entry[descriptors]
                .as_array()
                .unwrap_or_else(|| panic!("{} has no {descriptors}", crd.spec.names.kind));
            assert!(!list.is_empty());
            let paths: BTreeSet<&str> = list.iter().map(|d| str_at(d, "/path")).collect();
            for path in &paths {
                assert!(
                    schema_has(&schema["properties"][under], path),
                    "{} {descriptors}: {path} is not a field of {under}",
                    crd.spec.names.kind
                );
            }
            // The console shows only described fields: every top-level one has a descriptor.
            let fields = schema["properties"][under]["properties"]
                .as_object()
                .unwrap_or_else(|| panic!("{} has no {under} fields", crd.spec.names.kind));
            for field in fields.keys() {
                assert!(
                    paths.contains(field.as_str()),
                    "{} {descriptors}: no descriptor for {under}.{field}",
                    crd.spec.names.kind
                );
            }
        }
    }
    // alm-examples: one example of each owned kind, at least (the console's "Create" form).
    let examples: Value =
        serde_json::from_str(str_at(&csv, "/metadata/annotations/alm-examples")).expect("JSON");
    let kinds: BTreeSet<&str> = examples
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| str_at(e, "/kind"))
        .collect();
    let owned_kinds: BTreeSet<&str> = owned.iter().map(|o| str_at(o, "/kind")).collect();
    assert_eq!(kinds, owned_kinds);
    // The CdnPurge example is examples/purge.yaml's first.
    let purge = examples
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "CdnPurge")
        .expect("a CdnPurge example");
    assert_eq!(purge, &yaml_docs("examples/purge.yaml")[0]);
    let modes: Vec<(&str, bool)> = csv["spec"]["installModes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (str_at(m, "/type"), m["supported"].as_bool().unwrap()))
        .collect();
    assert!(modes.contains(&("AllNamespaces", true)));
    assert!(modes.contains(&("OwnNamespace", true)));
    // The annotation the OpenShift console reads to suggest the install namespace.
    assert_eq!(
        str_at(
            &csv,
            "/metadata/annotations/operatorframework.io~1suggested-namespace"
        ),
        "cdn-operator"
    );
}

/// The kinds OLM installs from a registry+v1 bundle (operator-registry's
/// pkg/lib/bundle/supported_resources.go). Not PodMonitor: operator-registry accepts it since
/// September 2025, but OLM's catalog operator (operator-lifecycle-manager's
/// pkg/controller/operators/catalog/supportedresources.go) does not, and fails the InstallPlan.
const OLM_BUNDLE_KINDS: [&str; 16] = [
    "ClusterServiceVersion",
    "CustomResourceDefinition",
    "Secret",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "ServiceAccount",
    "Service",
    "Role",
    "RoleBinding",
    "PrometheusRule",
    "ServiceMonitor",
    "PodDisruptionBudget",
    "PriorityClass",
    "VerticalPodAutoscaler",
    "ConsoleYAMLSample",
];

/// API groups every cluster with OLM serves: Kubernetes' own that bundle kinds use, and OLM's.
const KUBERNETES_GROUPS: [&str; 6] = [
    "",
    "apiextensions.k8s.io",
    "rbac.authorization.k8s.io",
    "policy",
    "scheduling.k8s.io",
    "operators.coreos.com",
];

#[test]
fn bundle_holds_what_olm_installs() {
    let mut kinds = BTreeSet::new();
    let mut groups = Vec::new();
    for entry in fs::read_dir(root().join("bundle/manifests")).expect("bundle/manifests") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let path = format!("bundle/manifests/{name}");
        let doc = yaml(&path);
        let kind = str_at(&doc, "/kind").to_string();
        assert!(
            OLM_BUNDLE_KINDS.contains(&kind.as_str()),
            "{path}: OLM does not install a {kind} from a bundle"
        );
        // OLM creates namespaced objects in the install namespace.
        assert!(
            doc.pointer("/metadata/namespace").is_none(),
            "{path}: a bundle object names no namespace"
        );
        // OLM fails the whole install of a bundle holding a kind the cluster lacks: every kind
        // is Kubernetes' own, OLM's, or of a CRD of the bundle (none of the Prometheus
        // Operator's: olm/monitoring holds those, for clusters that have them).
        let group = str_at(&doc, "/apiVersion")
            .rsplit_once('/')
            .map_or("", |(g, _)| g)
            .to_string();
        groups.push((path, kind.clone(), group));
        kinds.insert(kind);
    }
    let bundled_groups: BTreeSet<String> = crds().iter().map(|c| c.spec.group.clone()).collect();
    for (path, kind, group) in &groups {
        assert!(
            KUBERNETES_GROUPS.contains(&group.as_str()) || bundled_groups.contains(group),
            "{path}: {kind} of {group} needs a CRD outside the bundle: OLM fails the install where it is missing"
        );
    }
    for kind in [
        "ClusterServiceVersion",
        "CustomResourceDefinition",
        "Service",
        "PodDisruptionBudget",
        // The purge key's, which the operator may not create (kustomize/base/purge_signing_role.yaml).
        "Secret",
    ] {
        assert!(kinds.contains(kind), "the bundle has no {kind}");
    }
    // The metrics Service selects the CSV's operator pods and carries the labels the
    // ServiceMonitor of olm/monitoring selects it by (kustomize adds them; OLM adds nothing).
    let service = yaml("bundle/manifests/cdn-operator-metrics.service.yaml");
    let monitor = yaml("olm/monitoring/prometheus-operator/service_monitor.yaml");
    let pod_labels = &csv()["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]
        ["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&pod_labels[key], value, "selector {key}");
    }
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&service["metadata"]["labels"][key], value, "label {key}");
    }
    let job_label = str_at(&monitor, "/spec/jobLabel");
    assert_eq!(service["metadata"]["labels"][job_label], "cdn-operator");
}

#[test]
fn bundle_dockerfile_labels_are_the_bundle_annotations() {
    let annotations = yaml("bundle/metadata/annotations.yaml");
    let mut want: Vec<String> = annotations["annotations"]
        .as_object()
        .expect("annotations")
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect();
    want.sort();
    let mut labels: Vec<String> = read("bundle/bundle.Dockerfile")
        .lines()
        .filter_map(|l| l.strip_prefix("LABEL "))
        .map(str::to_string)
        .collect();
    labels.sort();
    assert_eq!(labels, want);
    assert_eq!(
        annotations["annotations"]["operators.operatorframework.io.bundle.mediatype.v1"],
        "registry+v1"
    );
}

#[test]
fn file_based_catalog_describes_the_bundle() {
    let docs = yaml_docs("olm/catalog/cdn-operator/catalog.yaml");
    let of =
        |schema: &str| -> Vec<&Value> { docs.iter().filter(|d| d["schema"] == schema).collect() };
    let packages = of("olm.package");
    assert_eq!(packages.len(), 1);
    let package = str_at(packages[0], "/name");
    let annotations = yaml("bundle/metadata/annotations.yaml");
    assert_eq!(
        package,
        str_at(
            &annotations,
            "/annotations/operators.operatorframework.io.bundle.package.v1"
        )
    );
    let bundles = of("olm.bundle");
    let bundle_names: BTreeSet<&str> = bundles.iter().map(|b| str_at(b, "/name")).collect();
    let channels = of("olm.channel");
    let channel_names: BTreeSet<&str> = channels.iter().map(|c| str_at(c, "/name")).collect();
    assert!(channel_names.contains(str_at(packages[0], "/defaultChannel")));
    for channel in &channels {
        assert_eq!(str_at(channel, "/package"), package);
        let entries = channel["entries"].as_array().expect("entries");
        let in_channel: BTreeSet<&str> = entries.iter().map(|e| str_at(e, "/name")).collect();
        for e in entries {
            assert!(
                bundle_names.contains(str_at(e, "/name")),
                "{e}: no such bundle"
            );
            // Upgrade edges only point at entries of the same channel.
            if let Some(replaces) = e.get("replaces") {
                assert!(in_channel.contains(replaces.as_str().unwrap()));
            }
            for skipped in e
                .get("skips")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                assert!(in_channel.contains(skipped.as_str().unwrap()));
            }
        }
    }
    // The bundle of this release is the one in bundle/.
    let csv = csv();
    let name = str_at(&csv, "/metadata/name");
    let bundle = bundles
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the catalog"));
    assert_eq!(str_at(bundle, "/package"), package);
    let properties = bundle["properties"].as_array().expect("properties");
    let prop = |t: &str| -> Vec<&Value> {
        properties
            .iter()
            .filter(|p| p["type"] == t)
            .map(|p| &p["value"])
            .collect()
    };
    assert_eq!(
        prop("olm.package"),
        vec![&json!({"packageName": package, "version": csv["spec"]["version"]})]
    );
    // What OLM's package server lists the channel from (opm render writes it for a bundle
    // image): the CSV's metadata and the parts of its spec operator-registry's CSVMetadata
    // keeps. An edited CSV fails here until the catalog is regenerated
    // (scripts/artifact_checks.py catalog-properties --write).
    let mut metadata = serde_json::Map::new();
    for (key, pointer) in [
        ("annotations", "/metadata/annotations"),
        ("apiServiceDefinitions", "/spec/apiservicedefinitions"),
        ("crdDescriptions", "/spec/customresourcedefinitions"),
        ("description", "/spec/description"),
        ("displayName", "/spec/displayName"),
        ("installModes", "/spec/installModes"),
        ("keywords", "/spec/keywords"),
        ("labels", "/metadata/labels"),
        ("links", "/spec/links"),
        ("maintainers", "/spec/maintainers"),
        ("maturity", "/spec/maturity"),
        ("minKubeVersion", "/spec/minKubeVersion"),
        ("nativeAPIs", "/spec/nativeAPIs"),
        ("provider", "/spec/provider"),
    ] {
        if let Some(value) = csv.pointer(pointer) {
            metadata.insert(key.to_string(), value.clone());
        }
    }
    assert_eq!(
        prop("olm.csv.metadata"),
        vec![&Value::Object(metadata)],
        "the catalog's olm.csv.metadata is not the CSV's: run scripts/artifact_checks.py catalog-properties --write"
    );
    assert!(
        prop("olm.bundle.object").is_empty(),
        "opm writes olm.bundle.object only for a bundle without an image"
    );
    let gvks: BTreeSet<(String, String, String)> = prop("olm.gvk")
        .iter()
        .map(|v| {
            (
                str_at(v, "/group").into(),
                str_at(v, "/version").into(),
                str_at(v, "/kind").into(),
            )
        })
        .collect();
    let owned: BTreeSet<(String, String, String)> = crds()
        .iter()
        .map(|c| {
            (
                c.spec.group.clone(),
                c.spec.versions[0].name.clone(),
                c.spec.names.kind.clone(),
            )
        })
        .collect();
    assert_eq!(gvks, owned);
    // The skipRange of the catalog is the CSV's.
    let entry = channels
        .iter()
        .flat_map(|c| c["entries"].as_array().unwrap())
        .find(|e| e["name"] == name)
        .expect("channel entry");
    assert_eq!(
        entry.get("skipRange").and_then(Value::as_str),
        csv["metadata"]["annotations"]
            .get("olm.skipRange")
            .and_then(Value::as_str)
    );
    let catalog_images: BTreeSet<&str> = bundle["relatedImages"]
        .as_array()
        .expect("relatedImages")
        .iter()
        .map(|i| str_at(i, "/image"))
        .collect();
    assert!(catalog_images.contains(str_at(bundle, "/image")));
    for image in csv["spec"]["relatedImages"].as_array().unwrap() {
        assert!(catalog_images.contains(str_at(image, "/image")));
    }
}

// ----- metrics used by the dashboard and the alerts -------------------------------------------

const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// Removes every `open … close` span (non-nested: label matchers, ranges, string literals).
fn strip(expr: &str, open: char, close: char) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in expr.chars() {
        if depth == 0 && c == open {
            depth = 1;
        } else if depth == 1 && c == close {
            depth = 0;
            out.push(' ');
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// Metric names a PromQL expression selects: identifiers that are not functions (followed by
/// `(`), keywords, grouping labels, label matchers, strings or durations.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let no_strings = strip(&strip(expr, '"', '"'), '\'', '\'');
    let no_matchers = strip(&strip(&no_strings, '{', '}'), '[', ']');
    // Grouping clauses name labels: `by (a, b)`, `without (a)`, `on (…)`, `ignoring (…)`.
    let mut cleaned = String::new();
    let mut rest = no_matchers.as_str();
    while let Some((word_start, paren)) = find_grouping(rest) {
        // Drop the keyword with its labels, so that `sum by (l) (x)` reads `sum (x)`.
        cleaned.push_str(&rest[..word_start]);
        let close = rest[paren..]
            .find(')')
            .map(|i| paren + i + 1)
            .unwrap_or(rest.len());
        rest = &rest[close..];
    }
    cleaned.push_str(rest);
    let chars: Vec<char> = cleaned.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let preceded_by_digit = start > 0 && chars[start - 1].is_ascii_digit();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            let is_function = next == Some(&'(');
            if !is_function
                && !preceded_by_digit
                && !PROMQL_WORDS.contains(&word.to_lowercase().as_str())
            {
                names.insert(word);
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The start of the first grouping keyword and the position of its `(`, if `rest` has one.
fn find_grouping(rest: &str) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for word in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        let mut from = 0;
        while let Some(pos) = rest[from..].find(word) {
            let start = from + pos;
            let end = start + word.len();
            let before_ok = start == 0
                || !rest[..start]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let after = rest[end..].trim_start();
            if before_ok && after.starts_with('(') {
                let paren = rest.len() - after.len();
                if best.is_none_or(|(b, _)| start < b) {
                    best = Some((start, paren));
                }
                break;
            }
            from = end;
        }
    }
    best
}

#[test]
fn the_metric_name_extractor_finds_metrics_and_only_metrics() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (controller, le) (rate(a_bucket{job="x", le=~"1.*"}[5m]))) / on (pod) group_left (node) max without (instance) (b_total offset 5m) > bool 1e3 and time() - c"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["a_bucket".to_string(), "b_total".into(), "c".into()])
    );
}

const OPERATOR_DASHBOARD: &str = "kustomize/components/grafana-dashboards/cdn-operator.json";
/// The CdnClusters' traffic, from the nginx-metrics sidecar (docs/cdn-metrics.md).
const CDN_DASHBOARD: &str = "kustomize/components/grafana-dashboards/cdn-clusters.json";
/// The alert group on the operator itself, and the one on the CdnClusters' traffic.
const OPERATOR_ALERTS: &str = "cdn-operator";
const CDN_ALERTS: &str = "cdnclusters";

/// The operator's own series (docs/metrics.txt).
fn exported_metrics() -> BTreeSet<String> {
    metric_list("docs/metrics.txt")
}

/// The nginx-metrics sidecar's series (docs/cdn-metrics.txt).
fn cdn_metrics() -> BTreeSet<String> {
    metric_list("docs/cdn-metrics.txt")
}

fn metric_list(path: &str) -> BTreeSet<String> {
    read(path)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

fn dashboard_exprs(path: &str) -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read(path)).expect("dashboard JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(str_at(target, "/expr").to_string());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(q) = var.pointer("/query/query").and_then(Value::as_str) {
            // label_values(metric{…}, label): the metric is what the dashboard needs.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.rsplit_once(','))
                .map(|(m, _)| m.to_string())
                .unwrap_or_else(|| q.to_string());
            exprs.push(inner);
        }
    }
    exprs
}

fn alert_exprs() -> Vec<String> {
    let rule = yaml("kustomize/components/prometheus/prometheus_rule.yaml");
    rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| str_at(r, "/expr").to_string())
        .collect()
}

/// The expressions of one group of the PrometheusRule (none when there is no such group).
fn alert_group_exprs(group: &str) -> Vec<String> {
    let rule = yaml("kustomize/components/prometheus/prometheus_rule.yaml");
    rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter(|g| g["name"] == group)
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| str_at(r, "/expr").to_string())
        .collect()
}

/// The metric names of labelled expressions; panics on one that selects no metric or one outside
/// `allowed` (a series nobody exports: the panel or alert would silently show nothing).
fn metrics_used(
    exprs: &[(String, String)],
    allowed: &BTreeSet<String>,
    list: &str,
) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (source, expr) in exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{source}: no metric in {expr}");
        for name in names {
            assert!(
                allowed.contains(&name),
                "{source} uses {name}, which is not exported ({list}): {expr}"
            );
            used.insert(name);
        }
    }
    used
}

fn labelled(source: &str, exprs: Vec<String>) -> Vec<(String, String)> {
    exprs.into_iter().map(|e| (source.to_string(), e)).collect()
}

#[test]
fn dashboard_and_alerts_only_use_exported_metrics() {
    let exported = exported_metrics();
    let cdn = cdn_metrics();
    // Prometheus writes `up` for every scrape target; the operator does not export it.
    let synthesized = BTreeSet::from(["up".to_string()]);
    // Every group of the PrometheusRule is one of the two below, so every alert is checked.
    let rule = yaml("kustomize/components/prometheus/prometheus_rule.yaml");
    let groups: Vec<&str> = rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| str_at(g, "/name"))
        .collect();
    assert_eq!(groups, [OPERATOR_ALERTS, CDN_ALERTS]);
    let all: Vec<(String, String)> = dashboard_exprs(OPERATOR_DASHBOARD)
        .into_iter()
        .chain(dashboard_exprs(CDN_DASHBOARD))
        .map(|e| ("a dashboard".to_string(), e))
        .chain(alert_exprs().into_iter().map(|e| ("alerts".to_string(), e)))
        .collect();
    assert_eq!(
        all.len(),
        dashboard_exprs(OPERATOR_DASHBOARD).len()
            + dashboard_exprs(CDN_DASHBOARD).len()
            + alert_group_exprs(OPERATOR_ALERTS).len()
            + alert_group_exprs(CDN_ALERTS).len()
    );
    // Everything shipped uses docs/metrics.txt ∪ docs/cdn-metrics.txt (∪ `up`) ...
    let either: BTreeSet<String> = exported
        .union(&cdn)
        .cloned()
        .chain(synthesized.clone())
        .collect();
    metrics_used(&all, &either, "docs/metrics.txt, docs/cdn-metrics.txt");

    // ... and each part only its own: the operator's dashboard and alerts the operator's series.
    let operator: Vec<(String, String)> =
        labelled("dashboard", dashboard_exprs(OPERATOR_DASHBOARD))
            .into_iter()
            .chain(labelled("alerts", alert_group_exprs(OPERATOR_ALERTS)))
            .collect();
    assert!(
        operator.len() > 10,
        "the dashboard and the alerts have queries"
    );
    let operator_allowed: BTreeSet<String> = exported.union(&synthesized).cloned().collect();
    let used = metrics_used(&operator, &operator_allowed, "docs/metrics.txt");
    // The dashboard covers what the issue asks for.
    for needed in [
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "controller_runtime_active_workers",
        "leader_election_master_status",
        "cdn_operator_cdnclusters",
        "cdn_operator_ats",
        "cdn_operator_cdnpurges",
        "cdn_operator_cdnpurge_oldest_open_seconds",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(used.contains(needed), "nothing shows {needed}");
    }

    // The CDN dashboard and the CdnClusters' alerts: the sidecar's series only (issue 37).
    let cdn_dashboard = labelled("CDN dashboard", dashboard_exprs(CDN_DASHBOARD));
    let cdn_alerts = labelled("CDN alerts", alert_group_exprs(CDN_ALERTS));
    assert!(cdn_dashboard.len() > 20, "the CDN dashboard has queries");
    assert!(cdn_alerts.len() >= 5, "the CDN alerts have queries");
    let used = metrics_used(&cdn_dashboard, &cdn, "docs/cdn-metrics.txt");
    let alerted = metrics_used(&cdn_alerts, &cdn, "docs/cdn-metrics.txt");
    for needed in [
        "cdn_requests_total",
        "cdn_sent_bytes_total",
        "cdn_upstream_received_bytes_total",
        "cdn_upstream_response_seconds_bucket",
        "cdn_upstream_response_seconds_count",
        "cdn_upstream_errors_total",
        "cdn_connections",
        "cdn_connections_accepted_total",
        "cdn_nginx_up",
        "cdn_cache_max_size_bytes",
        "cdn_cache_filesystem_size_bytes",
        "cdn_cache_filesystem_avail_bytes",
        "cdn_log_lines_total",
        "cdn_token_denials_total",
    ] {
        assert!(
            used.contains(needed),
            "the CDN dashboard shows nothing of {needed}"
        );
    }
    for needed in [
        "cdn_requests_total",
        "cdn_upstream_errors_total",
        "cdn_upstream_response_seconds_count",
        "cdn_upstream_received_bytes_total",
        "cdn_cache_max_size_bytes",
        "cdn_cache_filesystem_avail_bytes",
        "cdn_cache_filesystem_size_bytes",
        "cdn_nginx_up",
    ] {
        assert!(alerted.contains(needed), "no CDN alert uses {needed}");
    }
}

/// Every panel of a dashboard that is not a row: (title, description, its query expressions).
fn dashboard_panels(path: &str) -> Vec<(String, String, Vec<String>)> {
    let dashboard: Value = serde_json::from_str(&read(path)).expect("dashboard JSON");
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .map(|p| {
            let exprs = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| str_at(t, "/expr").to_string())
                .collect();
            let description = p["description"].as_str().unwrap_or_default().to_string();
            (str_at(p, "/title").to_string(), description, exprs)
        })
        .collect()
}

#[test]
fn dashboards_lay_out_panels_without_overlap() {
    for path in [OPERATOR_DASHBOARD, CDN_DASHBOARD] {
        let dashboard: Value = serde_json::from_str(&read(path)).expect("dashboard JSON");
        let mut cells = BTreeSet::new();
        let mut ids = BTreeSet::new();
        for panel in dashboard["panels"].as_array().expect("panels") {
            let id = panel["id"].as_u64().expect("panel id");
            assert!(ids.insert(id), "{path}: panel id {id} twice");
            let at = |k: &str| panel["gridPos"][k].as_u64().expect("gridPos");
            let (x, y, w, h) = (at("x"), at("y"), at("w"), at("h"));
            assert!(
                x + w <= 24 && w > 0 && h > 0,
                "{path}: panel {id} out of the grid"
            );
            for cell in (x..x + w).flat_map(|cx| (y..y + h).map(move |cy| (cx, cy))) {
                assert!(
                    cells.insert(cell),
                    "{path}: panel {id} overlaps another at {cell:?}"
                );
            }
        }
    }
}

#[test]
fn cdn_dashboard_shows_what_issue_37_asks() {
    let dashboard: Value = serde_json::from_str(&read(CDN_DASHBOARD)).expect("dashboard JSON");
    let operator: Value = serde_json::from_str(&read(OPERATOR_DASHBOARD)).expect("dashboard JSON");
    assert_ne!(
        dashboard["uid"], operator["uid"],
        "two dashboards, two uids"
    );
    // The variables: a data source, then namespace, cdncluster and role from the sidecar's series.
    let vars = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let names: Vec<&str> = vars.iter().map(|v| str_at(v, "/name")).collect();
    assert_eq!(names, ["datasource", "namespace", "cdncluster", "role"]);
    assert_eq!(vars[0]["type"], "datasource");
    assert_eq!(vars[0]["query"], "prometheus");
    for var in &vars[1..] {
        assert_eq!(var["datasource"]["uid"], "${datasource}");
        assert!(str_at(var, "/query/query").starts_with("label_values(cdn_"));
    }
    // Every panel queries ${datasource}, every query of it too.
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        for t in panel["targets"].as_array().expect("targets") {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{t}");
        }
    }
    let panels = dashboard_panels(CDN_DASHBOARD);
    assert!(panels.len() >= 20, "{} panels", panels.len());
    for (title, description, exprs) in &panels {
        assert!(
            !title.is_empty() && description.len() > 20,
            "{title}: a title and a description"
        );
        assert!(!exprs.is_empty(), "{title}: no query");
        for expr in exprs {
            // Each selector filters by the namespace variable; by the CdnCluster one too, except
            // in the top-10 panels, which rank the clusters of the selected namespaces.
            let selectors = expr.matches('{').count();
            assert!(selectors > 0, "{title}: {expr}");
            assert_eq!(
                expr.matches(r#"namespace=~"$namespace""#).count(),
                selectors,
                "{title}: a selector without namespace=~\"$namespace\": {expr}"
            );
            if !expr.starts_with("topk(") {
                assert_eq!(
                    expr.matches(r#"cdncluster=~"$cdncluster""#).count(),
                    selectors,
                    "{title}: a selector without cdncluster=~\"$cdncluster\": {expr}"
                );
            }
        }
    }
    let has = |what: &str, test: &dyn Fn(&str) -> bool| {
        assert!(
            panels
                .iter()
                .any(|(_, _, exprs)| exprs.iter().any(|e| test(e))),
            "the CDN dashboard shows no {what}"
        );
    };
    let per_cluster =
        |e: &str, grouping: &str| e.contains(&format!("sum by (namespace, cdncluster{grouping})"));
    has("hit ratio per CdnCluster", &|e| {
        per_cluster(e, "")
            && e.contains(r#"cdn_requests_total{"#)
            && e.contains(r#"cache_status=~"HIT|STALE|UPDATING|REVALIDATED""#)
            && e.contains(r#"cache_status!="NONE""#)
            && e.contains(" / ")
    });
    has("origin offload per CdnCluster", &|e| {
        per_cluster(e, "")
            && e.starts_with("1 - ")
            && e.contains("rate(cdn_upstream_received_bytes_total{")
            && e.contains(r#"source_kind="origin""#)
            && e.contains("rate(cdn_sent_bytes_total{")
    });
    has("origin offload of the CDN as a whole", &|e| {
        e.starts_with("1 - ")
            && e.contains(r#"role="cache", source_kind="origin""#)
            && e.contains(r#"role="balancer""#)
            && e.contains("rate(cdn_sent_bytes_total{")
    });
    has("request rate by status class", &|e| {
        per_cluster(e, ", status_class") && e.contains("rate(cdn_requests_total{")
    });
    has("request rate by cache status", &|e| {
        per_cluster(e, ", cache_status") && e.contains("rate(cdn_requests_total{")
    });
    has("5xx rate", &|e| {
        e.contains("rate(cdn_requests_total{") && e.contains(r#"status_class="5xx""#)
    });
    has("upstream p99 per CdnCluster", &|e| {
        e.starts_with("histogram_quantile(0.99, sum by (namespace, cdncluster, le) (rate(cdn_upstream_response_seconds_bucket{")
    });
    has("upstream errors by kind", &|e| {
        e.contains("rate(cdn_upstream_errors_total{") && e.contains(", kind)")
    });
    has("bytes served", &|e| {
        per_cluster(e, "") && e.contains("rate(cdn_sent_bytes_total{")
    });
    has("connections by state", &|e| {
        per_cluster(e, ", state") && e.contains("(cdn_connections{")
    });
    has("top CdnClusters by request rate", &|e| {
        e.starts_with("topk(") && e.contains("rate(cdn_requests_total{")
    });
    has("top CdnClusters by bytes", &|e| {
        e.starts_with("topk(") && e.contains("rate(cdn_sent_bytes_total{")
    });
    // Topology: each balancer with its cache tiers (the `source` label), each cache with its
    // origins.
    has("balancers' error ratio at their cache tiers", &|e| {
        per_cluster(e, ", source")
            && e.contains(r#"role="balancer", source_kind="cdncluster""#)
            && e.contains("rate(cdn_upstream_errors_total{")
            && e.contains("rate(cdn_upstream_response_seconds_count{")
    });
    has("balancers' latency at their cache tiers", &|e| {
        e.starts_with("histogram_quantile(0.99, sum by (namespace, cdncluster, source, le)")
            && e.contains(r#"role="balancer", source_kind="cdncluster""#)
    });
    has("caches' origin traffic", &|e| {
        per_cluster(e, ", source")
            && e.contains(r#"role="cache", source_kind="origin""#)
            && e.contains("rate(cdn_upstream_received_bytes_total{")
    });
    has("cache filesystem use", &|e| {
        e.contains("cdn_cache_filesystem_avail_bytes{")
            && e.contains("cdn_cache_filesystem_size_bytes{")
    });
    has("cache turnover against max_size", &|e| {
        e.contains(r#"cache_status=~"MISS|EXPIRED""#) && e.contains("cdn_cache_max_size_bytes{")
    });
    // Issue 49: the refusals of signed URLs, by reason.
    has("403s of signed URLs by reason", &|e| {
        per_cluster(e, ", reason") && e.contains("rate(cdn_token_denials_total{")
    });
    assert!(
        panels.iter().any(|(title, _, _)| title == "403s by reason"),
        "the CDN dashboard has no panel \"403s by reason\""
    );
}

/// `label OP "value"` matchers of `label` (=, !=, =~, !~) in an expression: the values, regular
/// expressions split on `|`.
fn matcher_alternatives(expr: &str, label: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = expr[from..].find(label) {
        let start = from + pos;
        from = start + label.len();
        let before = expr[..start].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &expr[from..];
        let Some(op) = ["=~", "!~", "!=", "="]
            .into_iter()
            .find(|op| rest.starts_with(op))
        else {
            continue;
        };
        let Some(value) = rest[op.len()..]
            .strip_prefix('"')
            .and_then(|v| v.split_once('"'))
        else {
            continue;
        };
        if op.contains('~') {
            out.extend(value.0.split('|').map(str::to_string));
        } else {
            out.push(value.0.to_string());
        }
    }
    out
}

#[test]
fn cdn_label_matchers_name_real_values() {
    assert_eq!(
        matcher_alternatives(
            r#"a{role="cache", kind=~"error|timeout", xrole="y", cache_status!="NONE"}"#,
            "role"
        ),
        ["cache"]
    );
    assert_eq!(
        matcher_alternatives(r#"a{role="cache", kind=~"error|timeout"}"#, "kind"),
        ["error", "timeout"]
    );
    // The label values of docs/cdn-metrics.md.
    let values: [(&str, &[&str]); 7] = [
        ("role", &["balancer", "cache"]),
        ("source_kind", &["cdncluster", "origin", "mixed", "none"]),
        ("status_class", &["1xx", "2xx", "3xx", "4xx", "5xx"]),
        (
            "cache_status",
            &[
                "HIT",
                "MISS",
                "EXPIRED",
                "STALE",
                "UPDATING",
                "REVALIDATED",
                "BYPASS",
                "NONE",
            ],
        ),
        ("kind", &["error", "timeout", "http_5xx"]),
        ("state", &["active", "reading", "writing", "waiting"]),
        ("result", &["counted", "unreadable"]),
    ];
    let mut checked = BTreeSet::new();
    let exprs = dashboard_exprs(CDN_DASHBOARD)
        .into_iter()
        .chain(alert_group_exprs(CDN_ALERTS));
    for expr in exprs {
        for (label, known) in values {
            for v in matcher_alternatives(&expr, label) {
                // A dashboard variable ($role) stands for the values of the series themselves.
                if v.starts_with('$') {
                    continue;
                }
                assert!(
                    known.contains(&v.as_str()),
                    "unknown {label} {v:?} in {expr}"
                );
                checked.insert(label);
            }
        }
    }
    assert_eq!(
        checked,
        BTreeSet::from([
            "role",
            "source_kind",
            "status_class",
            "cache_status",
            "kind"
        ]),
        "the CDN queries match on these labels"
    );
}

#[test]
fn domain_gauge_queries_count_each_object_once() {
    // The leader alone exports cdn_operator_*, by namespace; around a handover both replicas may
    // for one scrape. A query takes the max over replicas per namespace (and series) before any
    // sum, so no object counts twice, and the namespace stays for the alert to name.
    let mut checked = 0;
    let exprs = alert_exprs().into_iter().chain(dashboard_exprs(
        "kustomize/components/grafana-dashboards/cdn-operator.json",
    ));
    for expr in exprs {
        let domain = metric_names(&expr)
            .iter()
            .any(|m| m.starts_with("cdn_operator_"));
        // A template variable's bare selector (label_values) aggregates nothing.
        if domain && expr.contains('(') {
            assert!(
                expr.contains("max by (namespace"),
                "{expr}: sums cdn_operator_* over replicas (take max by (namespace, ...) first)"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 7,
        "the dashboard and alerts query the domain gauges"
    );
}

/// `label="value"` matchers of `label` in an expression.
fn matcher_values(expr: &str, label: &str) -> Vec<String> {
    let needle = format!("{label}=\"");
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(pos) = rest.find(&needle) {
        let before = rest[..pos].chars().next_back();
        let start = pos + needle.len();
        let end = rest[start..]
            .find('"')
            .map(|i| start + i)
            .unwrap_or(rest.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(rest[start..end].to_string());
        }
        rest = &rest[end..];
    }
    out
}

#[test]
fn state_and_phase_matchers_name_real_values() {
    let states: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
    let mut checked = 0;
    let exprs = alert_exprs().into_iter().chain(dashboard_exprs(
        "kustomize/components/grafana-dashboards/cdn-operator.json",
    ));
    for expr in exprs {
        for v in matcher_values(&expr, "state") {
            assert!(states.contains(&v.as_str()), "unknown state {v} in {expr}");
            checked += 1;
        }
        for v in matcher_values(&expr, "phase") {
            assert!(phases.contains(&v.as_str()), "unknown phase {v} in {expr}");
            checked += 1;
        }
        for v in matcher_values(&expr, "outcome") {
            assert!(
                ["Succeeded", "Failed", ""].contains(&v.as_str()),
                "unknown outcome {v}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "the alerts match on state, phase and outcome");
}

#[test]
fn every_alert_has_a_runbook_section() {
    let runbooks = read("docs/runbooks.md");
    let headings: BTreeSet<&str> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect();
    let rule = yaml("kustomize/components/prometheus/prometheus_rule.yaml");
    let mut alerts = 0;
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let alert = str_at(r, "/alert");
            alerts += 1;
            assert!(
                headings.contains(alert),
                "docs/runbooks.md has no section {alert}"
            );
            let url = str_at(r, "/annotations/runbook_url");
            assert!(
                url.ends_with(&format!("docs/runbooks.md#{}", alert.to_lowercase())),
                "{alert}: runbook_url {url}"
            );
            assert!(r["labels"]["severity"].is_string(), "{alert}: severity");
        }
    }
    // 7 on the operator (CdnPurgeIncomplete among them), 6 on the CdnClusters' traffic.
    assert_eq!(alerts, 13);
}

#[test]
fn argocd_overlay_puts_crds_first() {
    let k = yaml("argocd/overlay/kustomization.yaml");
    let text = serde_json::to_string(&k).unwrap();
    assert!(text.contains("CustomResourceDefinition"));
    assert!(text.contains(r#"argocd.argoproj.io/sync-wave: \"-1\""#));
    assert!(Path::new(&root().join("argocd/argocd-cm.yaml")).exists());
}

/// The image's `EXPOSE` is what `cdn-operator run` (its default command) listens on by default:
/// the ports of its `--*-bind-address` flags (probes, metrics).
#[test]
fn the_image_exposes_the_ports_the_operator_listens_on_by_default() {
    use clap::Args as _;
    let run = cdn_operator::run::Args::augment_args(clap::Command::new("run"));
    let listened: BTreeSet<u16> = run
        .get_arguments()
        .filter(|arg| arg.get_id().as_str().ends_with("bind_address"))
        .map(|arg| {
            let default = arg.get_default_values();
            let default = default[0].to_str().expect("a default address");
            let port = default.rsplit(':').next().expect("an address with a port");
            port.parse()
                .unwrap_or_else(|_| panic!("--{}: default {default}", arg.get_id()))
        })
        .collect();
    assert_eq!(listened.len(), 2, "probes and metrics: {listened:?}");
    let exposed: BTreeSet<u16> = read("Dockerfile")
        .lines()
        .filter_map(|line| line.strip_prefix("EXPOSE "))
        .flat_map(str::split_whitespace)
        .map(|port| {
            let port = port.trim_end_matches("/tcp");
            port.parse()
                .unwrap_or_else(|_| panic!("Dockerfile: EXPOSE {port}"))
        })
        .collect();
    assert_eq!(exposed, listened, "Dockerfile EXPOSE");
}

/// docs/operations.md's flag table has a row for every flag of `cdn-operator run`, with its
/// environment variable and its other names.
#[test]
fn the_flag_table_documents_every_flag_and_its_variable() {
    use clap::Args as _;
    let docs = read("docs/operations.md");
    let rows: Vec<&str> = docs
        .lines()
        .skip_while(|line| !line.starts_with("## Flags and environment variables"))
        .skip(1)
        .take_while(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with("| `--"))
        .collect();
    let run = cdn_operator::run::Args::augment_args(clap::Command::new("run"));
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" {
            continue;
        }
        let row = rows
            .iter()
            .find(|row| row.starts_with(&format!("| `--{long}`")))
            .unwrap_or_else(|| panic!("docs/operations.md: no row for --{long}"));
        let env = arg.get_env().expect("a variable").to_str().unwrap();
        assert!(
            row.contains(&format!("| `{env}` |")),
            "--{long}: {env}: {row}"
        );
        for alias in arg.get_visible_aliases().into_iter().flatten() {
            assert!(
                row.contains(&format!("`--{alias}`")),
                "--{long}: --{alias}: {row}"
            );
        }
    }
}
