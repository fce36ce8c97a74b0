//! `cdn-operator render`: golden outputs of the real binary for the seed examples and an invalid
//! topology, and the proof that it is what the controller applies: the seed examples reconciled
//! against the in-memory API give the very objects render prints.

mod golden;
mod support;

use cdn_operator::api::CdnCluster;
use cdn_operator::cdncluster::{self, status};
use cdn_operator::cli::manifests::Manifests;
use cdn_operator::cli::render::render;
use cdn_operator::kubernetes::events::Events;
use cdn_operator::kubernetes::record::APPLIED_HASH_ANNOTATION;
use golden::{cdn_operator, check, input, path, seed_examples};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, ListParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

#[test]
fn the_seed_examples_render_as_golden() {
    let seed = seed_examples();
    let run = cdn_operator(&["render", "-f", path(&seed)], "");
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-seed.yaml", &run.stdout);

    let run = cdn_operator(&["render", "--nginx-only", "-f", path(&seed)], "");
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-seed-nginx.conf", &run.stdout);
}

/// With the operator's metrics image, every pod has the metrics sidecar, started before nginx,
/// and every nginx sends it a line per request.
#[test]
fn the_seed_examples_with_metrics_render_a_sidecar_per_pod_as_golden() {
    let seed = seed_examples();
    let image = "ghcr.io/anevia/cdn-operator:0.1.0";
    let run = cdn_operator(
        &["render", "--nginx-metrics-image", image, "-f", path(&seed)],
        "",
    );
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-seed-metrics.yaml", &run.stdout);
    assert_eq!(run.stdout.matches("initContainers:").count(), 3);
    assert_eq!(run.stdout.matches("- nginx-metrics\n").count(), 3);
    assert_eq!(
        run.stdout
            .matches("access_log /tmp/cdn-metrics.log cdn_metrics buffer=64k flush=1s;")
            .count(),
        3
    );
    // Empty, as an unset environment variable of a manifest: no sidecar.
    let run = cdn_operator(
        &["render", "--nginx-metrics-image", "", "-f", path(&seed)],
        "",
    );
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-seed.yaml", &run.stdout);
}

#[test]
fn the_pool_example_renders_one_hashed_upstream_as_golden() {
    let pool = golden::root().join("examples/pool.yaml");
    let run = cdn_operator(&["render", "--nginx-only", "-f", path(&pool)], "");
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-pool-nginx.conf", &run.stdout);
    assert_eq!(
        run.stdout
            .matches("hash $host$uri$cdn_key_args consistent;")
            .count(),
        1
    );
}

/// A balancer exposed to viewers and placed as production clusters are, and its cache pool of
/// four: the Service's type, policy and annotations, the pods' placement, grace and stop delay,
/// and a PodDisruptionBudget for each cluster of several replicas.
#[test]
fn the_production_example_renders_exposure_placement_and_budgets_as_golden() {
    let production = golden::root().join("examples/production.yaml");
    let run = cdn_operator(&["render", "-f", path(&production)], "");
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-production.yaml", &run.stdout);
    let budgets: Vec<&str> = run
        .stdout
        .split("\n---\n")
        .filter(|d| d.contains("kind: PodDisruptionBudget"))
        .collect();
    assert_eq!(budgets.len(), 2, "one per cluster of several replicas");
}

/// A balancer behind an ingress controller: its Ingress, every path of the host to the Service's
/// `http` port, with the TLS Secret and the annotations the spec gives.
#[test]
fn the_ingress_example_renders_an_ingress_as_golden() {
    let example = golden::root().join("examples/ingress.yaml");
    let run = cdn_operator(&["render", "-f", path(&example)], "");
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-ingress.yaml", &run.stdout);
    assert_eq!(run.stdout.matches("kind: Ingress").count(), 1);
}

/// A balancer with signed URLs: njs and the verifier, the token out of the key and of what the
/// cache gets, the keys' Secret mounted and watched by the entrypoint; its Secret skipped.
#[test]
fn the_signed_urls_example_renders_the_verifier_and_the_keys_as_golden() {
    let example = golden::root().join("examples/signed-urls.yaml");
    let run = cdn_operator(&["render", "-f", path(&example)], "");
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (
            0,
            "cdn-operator: skipped Secret edge-token-keys (v1): neither a CdnCluster nor an At\n"
        )
    );
    check("render-signed-urls.yaml", &run.stdout);
    assert_eq!(run.stdout.matches("token.js: |").count(), 1);
}

#[test]
fn a_topology_with_tls_renders_as_golden() {
    let tls = input("tls-topology.yaml");
    let run = cdn_operator(&["render", "-f", path(&tls)], "");
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-tls.yaml", &run.stdout);

    let run = cdn_operator(&["render", "--nginx-only", "-f", path(&tls)], "");
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    check("render-tls-nginx.conf", &run.stdout);
    // One server of routes per cluster, whatever the ports; the redirect a server of its own.
    assert_eq!(run.stdout.matches("listen 8443 ssl;").count(), 2);
    assert_eq!(run.stdout.matches("return 301 https://").count(), 1);
    assert_eq!(run.stdout.matches("\n    server {").count(), 3);
}

/// `cdn-operator render … | head`: a reader gone before the output is written (its end of the
/// pipe closed before the command starts, so every write fails) ends the output quietly, as
/// with any Unix tool, for every command that prints.
#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    let seed = seed_examples();
    for args in [
        &["render", "-f", path(&seed)][..],
        &["render", "--nginx-only", "-f", path(&seed)],
        &["graph", "-f", path(&seed)],
        &["crd"],
        &["version"],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = golden::command(args)
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .output()
            .expect("run cdn-operator");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            (out.status.code(), stderr.as_ref()),
            (Some(0), ""),
            "{args:?}"
        );
    }
}

#[test]
fn the_output_is_a_stream_of_whole_kubernetes_objects() {
    let run = cdn_operator(&["render", "-f", path(&seed_examples())], "");
    let mut kinds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&run.stdout) {
        let value: Value = serde::Deserialize::deserialize(document).unwrap();
        let kind = value["kind"].as_str().unwrap().to_string();
        let api_version = value["apiVersion"].as_str().unwrap();
        let name = value["metadata"]["name"].as_str().unwrap().to_string();
        assert_eq!(value["metadata"]["namespace"], "default", "{kind} {name}");
        // Each parses as its type, and says nothing the type does not know.
        let typed = match kind.as_str() {
            "ConfigMap" => roundtrip::<ConfigMap>(&value),
            "Service" => roundtrip::<Service>(&value),
            "Deployment" => roundtrip::<Deployment>(&value),
            "Pod" => roundtrip::<Pod>(&value),
            other => panic!("unexpected kind {other}"),
        };
        assert_eq!(typed, value, "{kind} {name}");
        assert!(matches!(api_version, "v1" | "apps/v1"));
        kinds.push(format!("{kind} {name}"));
    }
    assert_eq!(
        kinds,
        [
            "ConfigMap balancer-nginx",
            "Service balancer",
            "Deployment balancer-deployment",
            "ConfigMap cache-live-nginx",
            "Service cache-live",
            "Deployment cache-live-deployment",
            "ConfigMap cache-vod-nginx",
            "Service cache-vod",
            "Deployment cache-vod-deployment",
            "Pod example-at-pod",
        ]
    );
    // An unapplied manifest has no uid to own its children by.
    assert!(!run.stdout.contains("ownerReferences"));
}

fn roundtrip<K: Serialize + DeserializeOwned>(value: &Value) -> Value {
    let typed: K = serde_json::from_value(value.clone()).unwrap();
    serde_json::to_value(typed).unwrap()
}

#[test]
fn an_invalid_topology_exits_1_with_the_condition_messages_and_prints_nothing() {
    let run = cdn_operator(&["render", "-f", path(&input("invalid-topology.yaml"))], "");
    assert_eq!(run.code, 1);
    assert_eq!(run.stdout, "", "nothing to pipe into kubectl diff");
    check("render-invalid.stderr", &run.stderr);
}

#[tokio::test]
async fn the_messages_are_those_of_the_ready_condition() {
    let manifests = Manifests::read(&[input("invalid-topology.yaml")], None, std::io::empty())
        .expect("readable");
    let problems = render(
        &manifests,
        &Default::default(),
        &Default::default(),
        cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
    )
    .unwrap_err();

    let fake = support::FakeApi::new().await;
    let api: Api<CdnCluster> = Api::namespaced(fake.client.clone(), "default");
    for cluster in &manifests.clusters {
        api.create(&PostParams::default(), cluster).await.unwrap();
    }
    let events = Events::new(fake.client.clone(), Some("test".into()));
    let mut conditions = Vec::new();
    for cluster in &manifests.clusters {
        let name = cluster.name_any();
        let fresh = Arc::new(api.get(&name).await.unwrap());
        cdncluster::reconcile(fresh, fake.context(events.clone()).await)
            .await
            .unwrap();
        let status = api.get(&name).await.unwrap().status.unwrap();
        // Deploying is not a problem: render prints the children of that one.
        let ready = status.conditions.iter().find(|c| c.type_ == status::READY);
        if let Some(ready) = ready.filter(|c| c.reason != "Deploying") {
            conditions.push(format!("CdnCluster default/{name}: {}", ready.message));
        }
    }
    assert_eq!(problems, conditions);
}

#[test]
fn stdin_and_the_namespace_flag() {
    let seed = std::fs::read_to_string(seed_examples().join("cdncluster-cache-live.yaml")).unwrap();
    let run = cdn_operator(
        &["render", "-n", "team-a", "--nginx-only", "-f", "-"],
        &seed,
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run
        .stdout
        .starts_with("# nginx configuration of CdnCluster team-a/cache-live (role cache)"));

    // A source is looked up in its own namespace only.
    let balancer =
        std::fs::read_to_string(seed_examples().join("cdncluster-balancer.yaml")).unwrap();
    let other = seed.replace("name: cache-live", "name: cache-live\n  namespace: other");
    let run = cdn_operator(&["render", "-f", "-"], &format!("{balancer}\n---\n{other}"));
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "cdn-operator: CdnCluster default/balancer: Source cache-live not found, will retry later\n"
    );
}

#[test]
fn other_kinds_are_skipped_with_a_note() {
    let input = "apiVersion: v1\nkind: Namespace\nmetadata: {name: cdn}\n";
    let run = cdn_operator(&["render", "-f", "-"], input);
    assert_eq!(run.code, 0);
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "cdn-operator: skipped Namespace cdn (v1): neither a CdnCluster nor an At\n"
    );
}

#[test]
fn exit_codes_tell_usage_from_input_errors() {
    let usage = cdn_operator(&["render"], "");
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    let missing = cdn_operator(&["render", "-f", "/nonexistent/cdn.yaml"], "");
    assert_eq!(missing.code, 1);
    assert!(
        missing
            .stderr
            .starts_with("cdn-operator: cannot read /nonexistent/cdn.yaml: "),
        "{}",
        missing.stderr
    );
    let bad = cdn_operator(
        &["render", "-f", "-"],
        "apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata: {name: a}\nspec: {role: proxy, sources: []}\n",
    );
    bad.fails_in_one_line(
        1,
        "cdn-operator: stdin: document 1: CdnCluster \"a\" is not valid: ",
    );
}

#[test]
fn the_pod_ids_flags_pin_every_pod_and_refuse_root() {
    let seed = seed_examples();
    let run = cdn_operator(
        &[
            "render",
            "--pod-run-as-user=1000680000",
            "--pod-run-as-group=0",
            "--pod-fs-group=1000680000",
            "-f",
            path(&seed),
        ],
        "",
    );
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    let pods: Vec<Value> = serde_yaml::Deserializer::from_str(&run.stdout)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter_map(|o| match o["kind"].as_str() {
            Some("Deployment") => Some(o["spec"]["template"]["spec"].clone()),
            Some("Pod") => Some(o["spec"].clone()),
            _ => None,
        })
        .collect();
    assert_eq!(pods.len(), 4, "three nginx Deployments and the At's pod");
    for pod in pods {
        let psc = &pod["securityContext"];
        assert_eq!(
            (&psc["runAsUser"], &psc["runAsGroup"], &psc["fsGroup"]),
            (&json!(1000680000), &json!(0), &json!(1000680000)),
            "{psc}"
        );
        assert_eq!(psc["runAsNonRoot"], json!(true));
    }
    let root = cdn_operator(&["render", "--pod-run-as-user=0", "-f", path(&seed)], "");
    assert_eq!(root.code, 2, "{}", root.stderr);
    assert!(
        root.stderr
            .contains("invalid value '0' for '--pod-run-as-user <UID>'"),
        "{}",
        root.stderr
    );
}

/// The seed examples reconciled against the in-memory API: what the controller applied is, field
/// for field, what render prints for the same objects (as `kubectl get -o yaml` gives them, uids
/// included); from the unapplied manifests, render differs only where a uid is needed.
#[tokio::test]
async fn render_prints_what_the_reconcile_applies() {
    let files = Manifests::read(&[seed_examples()], None, std::io::empty()).unwrap();
    let fake = support::FakeApi::new().await;
    let api: Api<CdnCluster> = Api::namespaced(fake.client.clone(), "default");
    for cluster in &files.clusters {
        api.create(&PostParams::default(), cluster).await.unwrap();
    }
    let events = Events::new(fake.client.clone(), Some("test".into()));
    for cluster in &files.clusters {
        let fresh = Arc::new(api.get(&cluster.name_any()).await.unwrap());
        cdncluster::reconcile(fresh, fake.context(events.clone()).await)
            .await
            .expect("reconcile");
    }

    let mut live = api.list(&ListParams::default()).await.unwrap().items;
    // In the order of the files, to compare with their rendering.
    live.sort_by_key(|c| {
        files
            .clusters
            .iter()
            .position(|f| f.name_any() == c.name_any())
    });
    let exported = Manifests {
        clusters: live,
        ..Manifests::default()
    };
    let rendered = render(
        &exported,
        &Default::default(),
        &Default::default(),
        cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
    )
    .expect("the seed examples are valid");
    assert_eq!(rendered.clusters.len(), 3);
    for children in &rendered.clusters {
        assert_applied(&fake, &children.config_map).await;
        assert_applied(&fake, &children.service).await;
        assert_applied(&fake, children.workload.deployment().unwrap()).await;
    }

    // From the files: no uid, so no owner; nothing else differs (the nginx configuration
    // names the sources' Services, not their uids).
    let from_files = render(
        &files,
        &Default::default(),
        &Default::default(),
        cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
    )
    .unwrap();
    for (offline, exported) in from_files.clusters.iter().zip(&rendered.clusters) {
        assert_eq!(
            without_uids(&offline.config_map),
            without_uids(&exported.config_map)
        );
        assert_eq!(
            without_uids(&offline.service),
            without_uids(&exported.service)
        );
        assert_eq!(
            without_uids(&offline.workload.deployment().unwrap()),
            without_uids(&exported.workload.deployment().unwrap())
        );
        assert!(offline
            .workload
            .deployment()
            .unwrap()
            .owner_references()
            .is_empty());
        assert!(!exported
            .workload
            .deployment()
            .unwrap()
            .owner_references()
            .is_empty());
    }
    assert_eq!(rendered.nginx(), from_files.nginx());
}

/// The object the API holds under `desired`'s name, without what the server and the apply
/// bookkeeping add, equals `desired`.
async fn assert_applied<K>(fake: &support::FakeApi, desired: &K)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(fake.client.clone(), "default");
    let applied = api.get(&desired.name_any()).await.expect("applied");
    let mut applied = support::without_server_fields(&applied);
    let metadata = applied["metadata"].as_object_mut().unwrap();
    let annotations = metadata["annotations"].as_object_mut().unwrap();
    assert!(annotations.remove(APPLIED_HASH_ANNOTATION).is_some());
    if annotations.is_empty() {
        metadata.remove("annotations");
    }
    assert_eq!(
        applied,
        serde_json::to_value(desired).unwrap(),
        "{} {}",
        K::kind(&()),
        desired.name_any()
    );
}

/// `object` as JSON without what needs the uids: its ownerReferences.
fn without_uids<K: Serialize>(object: &K) -> Value {
    let mut value = serde_json::to_value(object).unwrap();
    value["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    value
}
