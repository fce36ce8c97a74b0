//! What the benchmark creates and deletes: its CdnClusters (per group of ten, a balancer in front
//! of nine caches), their namespaces, and the waits until namespaces are gone.

use cdn_operator::api::CdnCluster;
use cdn_operator_e2e::delete_namespace;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub const GROUP: usize = 10;
pub const BENCH_LABEL: &str = "cdn-operator-bench";

/// Cluster `i`: per group of ten, one balancer routing by path to nine caches with URL origins.
pub fn manifest(i: usize, namespaces: &[String], replicas: i32) -> CdnCluster {
    let group = i / GROUP;
    let ns = &namespaces[group % namespaces.len()];
    let (name, spec) = if i.is_multiple_of(GROUP) {
        let sources: Vec<_> = (1..GROUP)
            .map(|k| json!({"name": format!("c{group}-{k}"), "pathCondition": format!("^/c{k}/")}))
            .collect();
        (
            format!("b{group}"),
            json!({"role": "balancer", "sources": sources, "replicas": replicas}),
        )
    } else {
        let origin = json!({"name": "origin", "origin": {"url": format!("http://origin-{group}.example.com:8080/media")}});
        (
            format!("c{group}-{}", i % GROUP),
            json!({"role": "cache", "sources": [origin], "replicas": replicas}),
        )
    };
    serde_json::from_value(json!({
        "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
        "metadata": {"name": name, "namespace": ns, "labels": {BENCH_LABEL: "true"}},
        "spec": spec,
    }))
    .expect("a CdnCluster")
}

/// The `clusters` CdnClusters of a run over `namespaces`.
pub fn manifests(clusters: usize, namespaces: &[String], replicas: i32) -> Vec<CdnCluster> {
    (0..clusters)
        .map(|i| manifest(i, namespaces, replicas))
        .collect()
}

/// `--print-manifests`: the CdnClusters a run would create, as YAML, in the namespaces
/// `<prefix>-0`, `<prefix>-1`, … and without the benchmark's label.
pub fn print_manifests(
    prefix: &str,
    clusters: usize,
    namespaces: usize,
    replicas: i32,
) -> ExitCode {
    let namespaces: Vec<String> = (0..namespaces).map(|i| format!("{prefix}-{i}")).collect();
    let yaml: String = (0..clusters)
        .map(|i| {
            let mut cluster = manifest(i, &namespaces, replicas);
            cluster.metadata.labels = None;
            let yaml = serde_yaml::to_string(&cluster).expect("a CdnCluster as YAML");
            format!("---\n{yaml}")
        })
        .collect();
    cdn_operator::cli::print_out(&yaml)
}

/// Waits until no namespace matches `selector` (`what` they are, for the messages).
pub async fn await_namespaces_gone(
    client: &Client,
    selector: &str,
    what: &str,
    limit: Duration,
) -> Result<(), String> {
    let api: Api<Namespace> = Api::all(client.clone());
    let params = ListParams::default().labels(selector);
    let deadline = Instant::now() + limit;
    loop {
        let left = api
            .list_metadata(&params)
            .await
            .map_err(|e| format!("cannot list namespaces: {e}"))?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{left} {what} still there after {limit:?} (kubectl delete namespace -l {selector})"
            ));
        }
        eprintln!("bench: waiting for {left} {what} to be deleted");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Deletes `namespaces`, all labelled `label`, and waits until they are gone: what one phase
/// created must not weigh on the server while the other is measured.
pub async fn delete_all(
    client: &Client,
    namespaces: &[String],
    label: &str,
    what: &str,
    limit: Duration,
) -> Result<(), String> {
    for name in namespaces {
        delete_namespace(client, name).await?;
    }
    let selector = format!("{BENCH_LABEL}={label}");
    await_namespaces_gone(client, &selector, what, limit).await
}

pub async fn create_namespaces(client: &Client, names: &[String], label: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    for name in names {
        let ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {BENCH_LABEL: label}}}),
        )
        .unwrap();
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
    }
}

/// Creates `clusters`, 32 at a time: the server's answers, as they come. Whoever needs none
/// drops each as it comes, and keeps no 10,000 of them on the machine it measures.
pub fn create_all<'a>(
    client: &'a Client,
    clusters: &'a [CdnCluster],
) -> impl Stream<Item = CdnCluster> + 'a {
    futures::stream::iter(clusters.iter().cloned())
        .map(|c| {
            let api: Api<CdnCluster> = Api::namespaced(client.clone(), &c.namespace().unwrap());
            async move {
                api.create(&PostParams::default(), &c)
                    .await
                    .unwrap_or_else(|e| panic!("create {}: {e}", c.name_any()))
            }
        })
        .buffer_unordered(32)
}

/// The names of one run: the operator's namespaces, labelled with the run's id, and the
/// baseline's, labelled apart (`<id>-base`), so that each phase's namespaces can be awaited gone
/// alone.
pub struct Names {
    pub run: String,
    pub namespaces: Vec<String>,
    pub baseline_namespaces: Vec<String>,
    pub base_label: String,
}

impl Names {
    /// `count` namespaces for each phase, named after the clock.
    pub fn new(count: usize) -> Names {
        let run = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros()
                % 0xffffff
        );
        let namespaces: Vec<String> = (0..count).map(|i| format!("cdn-bench-{run}-{i}")).collect();
        let baseline_namespaces: Vec<String> = (0..count)
            .map(|i| format!("cdn-bench-{run}-base-{i}"))
            .collect();
        let base_label = format!("{run}-base");
        Names {
            run,
            namespaces,
            baseline_namespaces,
            base_label,
        }
    }
}
