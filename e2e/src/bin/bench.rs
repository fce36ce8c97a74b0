//! The benchmark against the cluster of `KUBECONFIG`: N CdnClusters (a balancer in front of nine
//! caches per group of ten, over several namespaces) reconciled by the built operator, run out of
//! cluster behind a counting proxy. Prints a table, writes JSON, asserts no times. With no
//! reachable cluster: one line, exit 0.
//!
//! Measured:
//! - time until every child is applied and every status written (from the first create);
//! - API requests and writes per reconcile: every request of the operator passes the proxy,
//!   counted by verb and resource; reconciles from its `controller_runtime_reconcile_total`;
//! - writes during the steady state: the proxy's write count, and the resourceVersion changes of
//!   the CdnClusters and children seen by watches (target 0);
//! - latency from a spec change to the child updated (the ConfigMap, seen by a watch): p50, p99;
//! - the operator's VmRSS after the steady state and at the end, its peak (VmHWM), and its CPU
//!   seconds in each phase (convergence, steady state, spec changes); the time per 1,000;
//! - the bare-client baseline: the same server-side applies (children and status, through the
//!   operator's own apply path and the same proxy and concurrency) from one client; the ratio.

use cdn_operator::api::{CdnCluster, Role, State};
use cdn_operator::cdncluster::status::{self, Observed};
use cdn_operator::cdncluster::{build, sources};
use cdn_operator_e2e::proxy::Proxy;
use cdn_operator_e2e::{connect, install_crds, NamespaceGuard, Operator, OperatorOptions};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    about = "Benchmark cdn-operator against the cluster of KUBECONFIG (use a dedicated test cluster: the operator runs cluster-wide)"
)]
struct Args {
    /// Number of CdnClusters.
    #[arg(long, default_value_t = 1000)]
    clusters: usize,
    /// Number of namespaces they are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// Replicas of each CdnCluster. At least 1, as in any real cluster: with 0 the deployment
    /// controller stops writing Deployment status early, which hides a reconcile it triggers.
    #[arg(long, default_value_t = 1)]
    replicas: i32,
    /// The operator's --max-concurrent-reconciles, also the baseline's concurrency.
    #[arg(long, default_value_t = 16)]
    max_concurrent_reconciles: u16,
    /// Length of the steady-state observation, in seconds.
    #[arg(long, default_value_t = 120)]
    steady_seconds: u64,
    /// Number of spec changes timed for the latency figures.
    #[arg(long, default_value_t = 100)]
    latency_samples: usize,
    /// Give up converging after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_seconds: u64,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/e2e-bench.json")]
    json: PathBuf,
    /// Keep the namespaces afterwards.
    #[arg(long)]
    keep: bool,
}

const GROUP: usize = 10;
const BENCH_LABEL: &str = "cdn-operator-bench";

/// Cluster `i`: per group of ten, one balancer routing by path to nine caches with URL origins.
fn manifest(i: usize, namespaces: &[String], replicas: i32) -> CdnCluster {
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

fn store<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(
        watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .for_each(|_| futures::future::ready(())),
    );
    reader
}

/// Counts the changes (not the initial list) of objects of `namespaces` seen by a watch.
fn count_changes<K>(
    api: Api<K>,
    config: watcher::Config,
    namespaces: Arc<HashSet<String>>,
) -> Arc<AtomicU64>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let counter = Arc::new(AtomicU64::new(0));
    let count = counter.clone();
    tokio::spawn(
        watcher(api, config)
            .default_backoff()
            .try_for_each(move |event| {
                if let watcher::Event::Apply(obj) | watcher::Event::Delete(obj) = &event {
                    if obj.namespace().is_some_and(|ns| namespaces.contains(&ns)) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                futures::future::ready(Ok(()))
            }),
    );
    counter
}

/// The objects of `store` in `namespaces`.
fn ours_in<K>(store: &Store<K>, namespaces: &HashSet<String>) -> Vec<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .state()
        .into_iter()
        .filter(|o| {
            o.meta()
                .namespace
                .as_ref()
                .is_some_and(|ns| namespaces.contains(ns))
        })
        .collect()
}

/// Waits until the proxy has seen no request for `quiet` (the operator is idle).
async fn settle(proxy: &Proxy, quiet: Duration, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut last = proxy.counts();
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = proxy.counts();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Waits until no namespace matches `selector` (`what` they are, for the messages).
async fn await_namespaces_gone(
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

async fn create_namespaces(client: &Client, names: &[String], run: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    for name in names {
        let ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {BENCH_LABEL: run}}}),
        )
        .unwrap();
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
    }
}

async fn create_all(client: &Client, clusters: &[CdnCluster]) {
    futures::stream::iter(clusters.iter().cloned())
        .for_each_concurrent(32, |c| {
            let api: Api<CdnCluster> = Api::namespaced(client.clone(), &c.namespace().unwrap());
            async move {
                api.create(&PostParams::default(), &c)
                    .await
                    .unwrap_or_else(|e| panic!("create {}: {e}", c.name_any()));
            }
        })
        .await;
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let Some(client) = connect("cdn-operator benchmark").await else {
        return ExitCode::SUCCESS;
    };
    let n = args.clusters;
    install_crds(&client).await;
    // An earlier run's namespaces are deleted after it ends, and an operator started meanwhile
    // would list and reconcile their CdnClusters too.
    let earlier = "namespaces of earlier runs";
    let limit = Duration::from_secs(1800);
    if let Err(error) = await_namespaces_gone(&client, BENCH_LABEL, earlier, limit).await {
        eprintln!("bench: {error} (kept with --keep?)");
        return ExitCode::FAILURE;
    }
    let run = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros()
            % 0xffffff
    );
    let namespaces: Vec<String> = (0..args.namespaces)
        .map(|i| format!("cdn-bench-{run}-{i}"))
        .collect();
    let baseline_namespaces: Vec<String> = (0..args.namespaces)
        .map(|i| format!("cdn-bench-{run}-base-{i}"))
        .collect();
    let _guard = NamespaceGuard {
        namespaces: namespaces
            .iter()
            .chain(&baseline_namespaces)
            .cloned()
            .collect(),
        keep: args.keep,
    };
    create_namespaces(&client, &namespaces, &run).await;
    let ours: Arc<HashSet<String>> = Arc::new(namespaces.iter().cloned().collect());

    let dir = tempfile::tempdir().expect("temporary directory");
    let proxy = Proxy::start(client.clone())
        .await
        .expect("the counting proxy");
    let options = OperatorOptions {
        namespace: None,
        lease: None,
        kubeconfig: Some(proxy.kubeconfig(dir.path())),
        args: vec![format!(
            "--max-concurrent-reconciles={}",
            args.max_concurrent_reconciles
        )],
    };
    let mut operator = options.start("bench").await;
    settle(&proxy, Duration::from_secs(2), Duration::from_secs(60)).await;
    let startup = proxy.counts();
    let reconciles = |op: &Operator| {
        op.metric_sum(
            "controller_runtime_reconcile_total",
            "controller=\"cdncluster\"",
        )
    };
    let reconciles_before = reconciles(&operator);
    let at_start = operator.usage();

    let children = watcher::Config::default().labels("app.kubernetes.io/managed-by=cdn-operator");
    let clusters_store = store(
        Api::<CdnCluster>::all(client.clone()),
        watcher::Config::default().labels(&format!("{BENCH_LABEL}=true")),
    );
    let deployments = store(Api::<Deployment>::all(client.clone()), children.clone());
    let config_maps = store(Api::<ConfigMap>::all(client.clone()), children.clone());
    let services = store(Api::<Service>::all(client.clone()), children.clone());
    for ready in [
        clusters_store.wait_until_ready().await,
        deployments.wait_until_ready().await,
        config_maps.wait_until_ready().await,
        services.wait_until_ready().await,
    ] {
        ready.expect("the benchmark's watches");
    }

    // 1. Convergence.
    let manifests: Vec<CdnCluster> = (0..n)
        .map(|i| manifest(i, &namespaces, args.replicas))
        .collect();
    eprintln!(
        "bench: creating {n} CdnClusters in {} namespaces",
        namespaces.len()
    );
    let start = Instant::now();
    create_all(&client, &manifests).await;
    let created = start.elapsed();
    let deadline = start + Duration::from_secs(args.timeout_seconds);
    let (mut children_at, converged);
    children_at = None;
    loop {
        let d = ours_in(&deployments, &ours).len();
        let c = ours_in(&config_maps, &ours).len();
        let s = ours_in(&services, &ours).len();
        if children_at.is_none() && d >= n && c >= n && s >= n {
            children_at = Some(start.elapsed());
        }
        let done = ours_in(&clusters_store, &ours)
            .iter()
            .filter(|c| {
                c.status.as_ref().is_some_and(|st| {
                    st.observed_generation == c.metadata.generation
                        && matches!(st.state, Some(State::Deploying | State::Running))
                })
            })
            .count();
        if children_at.is_some() && done >= n {
            converged = start.elapsed();
            break;
        }
        if Instant::now() > deadline {
            eprintln!(
                "bench: not converged after {}s: {done}/{n} statuses, {d}/{c}/{s} children\n{}",
                args.timeout_seconds,
                operator.logs()
            );
            return ExitCode::FAILURE;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let children_at = children_at.unwrap_or(converged);
    eprintln!("bench: converged in {converged:?}; waiting for the operator to go quiet");
    // Events follow the status write of each reconcile: count them too.
    settle(&proxy, Duration::from_secs(5), Duration::from_secs(120)).await;
    let convergence = proxy.counts().since(&startup);
    let at_converged = operator.usage();
    let reconciled = match (reconciles_before, reconciles(&operator)) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };

    // 2. Steady state.
    eprintln!(
        "bench: observing the steady state for {}s",
        args.steady_seconds
    );
    let steady_start = proxy.counts();
    let cluster_changes = count_changes(
        Api::<CdnCluster>::all(client.clone()),
        watcher::Config::default().labels(&format!("{BENCH_LABEL}=true")),
        ours.clone(),
    );
    let child_changes = [
        count_changes(
            Api::<Deployment>::all(client.clone()),
            children.clone(),
            ours.clone(),
        ),
        count_changes(
            Api::<ConfigMap>::all(client.clone()),
            children.clone(),
            ours.clone(),
        ),
        count_changes(
            Api::<Service>::all(client.clone()),
            children.clone(),
            ours.clone(),
        ),
    ];
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let steady = proxy.counts().since(&steady_start);
    let at_steady = operator.usage();
    let steady_rv_changes = cluster_changes.load(Ordering::Relaxed)
        + child_changes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>();

    // 3. Spec change → ConfigMap updated.
    let caches: Vec<&CdnCluster> = manifests
        .iter()
        .filter(|c| c.spec.role == Role::Cache)
        .take(args.latency_samples)
        .collect();
    eprintln!("bench: timing {} spec changes", caches.len());
    let mut latencies = Vec::new();
    for (k, cache) in caches.iter().enumerate() {
        let ns = cache.namespace().unwrap();
        let cm_ref =
            reflector::ObjectRef::new(&build::config_map_name(&cache.name_any())).within(&ns);
        let before = config_maps.get(&cm_ref).and_then(|c| c.resource_version());
        let api: Api<CdnCluster> = Api::namespaced(client.clone(), &ns);
        let change = json!({"spec": {"cache": {"valid": format!("{}m", 11 + k)}}});
        let t = Instant::now();
        api.patch(
            &cache.name_any(),
            &PatchParams::default(),
            &Patch::Merge(change),
        )
        .await
        .expect("spec change");
        let limit = t + Duration::from_secs(60);
        loop {
            if config_maps.get(&cm_ref).and_then(|c| c.resource_version()) != before {
                latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            if Instant::now() > limit {
                eprintln!("bench: {ns}/{} not updated within 60s", cm_ref.name);
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let at_end = operator.usage();
    let rss = at_end.map(|u| u.rss_kib);
    let cpu = |from: Option<cdn_operator_e2e::Usage>, to: Option<cdn_operator_e2e::Usage>| {
        Some(to?.cpu_seconds - from?.cpu_seconds)
    };
    let mib = |k: Option<u64>| {
        k.map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
            .unwrap_or_else(|| "n/a".into())
    };
    let seconds = |s: Option<f64>| {
        s.map(|s| format!("{s:.2} s"))
            .unwrap_or_else(|| "n/a".into())
    };
    let (cpu_converge, cpu_steady, cpu_changes) = (
        cpu(at_start, at_converged),
        cpu(at_converged, at_steady),
        cpu(at_steady, at_end),
    );
    operator.terminate();
    let exit = operator.exit_within(Duration::from_secs(30)).await;
    drop(operator);

    // 4. Baseline: the same applies from one client, no operator running, on the server as the
    // operator found it: the operator's objects are deleted first (kept with --keep), as they
    // would weigh on the server the baseline measures.
    if !args.keep {
        eprintln!("bench: deleting the operator's namespaces before the baseline");
        let api: Api<Namespace> = Api::all(client.clone());
        for name in &namespaces {
            if let Err(error) = api.delete(name, &DeleteParams::background()).await {
                eprintln!("bench: cannot delete namespace {name}: {error}");
                return ExitCode::FAILURE;
            }
        }
        // The baseline's namespaces, of the same run, do not exist yet.
        let selector = format!("{BENCH_LABEL}={run}");
        let limit = Duration::from_secs(args.timeout_seconds);
        let what = "namespaces of the operator";
        if let Err(error) = await_namespaces_gone(&client, &selector, what, limit).await {
            eprintln!("bench: {error}");
            return ExitCode::FAILURE;
        }
    }
    eprintln!("bench: baseline");
    create_namespaces(&client, &baseline_namespaces, &run).await;
    let baseline_manifests: Vec<CdnCluster> = (0..n)
        .map(|i| manifest(i, &baseline_namespaces, args.replicas))
        .collect();
    create_all(&client, &baseline_manifests).await;
    let bare = Client::try_from(
        Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(proxy.kubeconfig(dir.path()))
                .expect("proxy kubeconfig"),
            &Default::default(),
        )
        .await
        .expect("proxy config"),
    )
    .expect("client");
    let by_key: HashMap<(String, String), Arc<CdnCluster>> = baseline_manifests
        .iter()
        .map(|c| ((c.namespace().unwrap(), c.name_any()), Arc::new(c.clone())))
        .collect();
    let baseline_start_counts = proxy.counts();
    let baseline_start = Instant::now();
    futures::stream::iter(baseline_manifests.iter())
        .for_each_concurrent(args.max_concurrent_reconciles as usize, |cluster| {
            let bare = bare.clone();
            let by_key = &by_key;
            async move {
                let ns = cluster.namespace().unwrap();
                let upstreams = sources::resolve(cluster, |name| {
                    by_key.get(&(ns.clone(), name.to_string())).cloned()
                })
                .expect("resolves");
                let kids = build::children(cluster, &upstreams, &Default::default());
                use cdn_operator::apply::apply_always;
                apply_always(
                    &Api::<ConfigMap>::namespaced(bare.clone(), &ns),
                    kids.config_map,
                )
                .await
                .expect("ConfigMap");
                apply_always(&Api::<Service>::namespaced(bare.clone(), &ns), kids.service)
                    .await
                    .expect("Service");
                let deployment = apply_always(
                    &Api::<Deployment>::namespaced(bare.clone(), &ns),
                    kids.deployment,
                )
                .await
                .expect("Deployment");
                let live: CdnCluster = Api::<CdnCluster>::namespaced(bare.clone(), &ns)
                    .get(&cluster.name_any())
                    .await
                    .expect("get");
                let status = status::desired(
                    &live,
                    Observed::Deployed(Some(&deployment)),
                    &Time(jiff::Timestamp::now()),
                );
                cdn_operator::apply::apply_status(
                    &Api::<CdnCluster>::namespaced(bare.clone(), &ns),
                    &live,
                    None,
                    &status,
                )
                .await
                .expect("status");
            }
        })
        .await;
    let baseline_time = baseline_start.elapsed();
    let baseline = proxy.counts().since(&baseline_start_counts);

    // Report.
    let secs = |d: Duration| d.as_secs_f64();
    let per = |x: u64, d: Option<f64>| d.filter(|d| *d > 0.0).map(|d| x as f64 / d);
    let fmt = |x: Option<f64>| {
        x.map(|v| format!("{v:.2}"))
            .unwrap_or_else(|| "n/a (no controller_runtime_reconcile_total)".into())
    };
    println!("\n== cdn-operator benchmark: {n} CdnClusters ({} balancers, {} caches), {} namespaces, replicas {} ==", n.div_ceil(GROUP), n - n.div_ceil(GROUP), namespaces.len(), args.replicas);
    println!("| measure | value |");
    println!("|---|---|");
    println!("| creates sent (user) | {:.2} s |", secs(created));
    println!("| every child applied | {:.2} s |", secs(children_at));
    println!("| every status written | {:.2} s |", secs(converged));
    println!(
        "| reconciles (operator metric) | {} |",
        reconciled
            .map(|r| format!("{r:.0}"))
            .unwrap_or_else(|| "n/a".into())
    );
    println!(
        "| API requests during convergence | {} |",
        convergence.requests()
    );
    println!(
        "| API writes during convergence | {} |",
        convergence.writes()
    );
    println!(
        "| requests per reconcile | {} |",
        fmt(per(convergence.requests(), reconciled))
    );
    println!(
        "| writes per reconcile | {} |",
        fmt(per(convergence.writes(), reconciled))
    );
    println!(
        "| writes per CdnCluster | {:.2} |",
        convergence.writes() as f64 / n as f64
    );
    println!(
        "| steady state ({} s): operator writes (proxy) | {} |",
        args.steady_seconds,
        steady.writes()
    );
    println!("| steady state: resourceVersion changes seen (CdnClusters + children, any writer) | {steady_rv_changes} |");
    println!(
        "| spec change → ConfigMap updated p50 | {:.1} ms |",
        percentile(&latencies, 50.0)
    );
    println!(
        "| spec change → ConfigMap updated p99 | {:.1} ms |",
        percentile(&latencies, 99.0)
    );
    println!(
        "| time per 1,000 CdnClusters (every status written) | {:.2} s |",
        secs(converged) * 1000.0 / n as f64
    );
    println!("| operator CPU: convergence | {} |", seconds(cpu_converge));
    println!("| operator CPU: steady state | {} |", seconds(cpu_steady));
    println!("| operator CPU: spec changes | {} |", seconds(cpu_changes));
    println!(
        "| operator VmRSS after the steady state | {} |",
        mib(at_steady.map(|u| u.rss_kib))
    );
    println!(
        "| operator peak VmRSS (VmHWM) | {} |",
        mib(at_end.map(|u| u.peak_rss_kib))
    );
    println!("| operator VmRSS at the end | {} |", mib(rss));
    println!(
        "| baseline: same applies from one client | {:.2} s, {} writes |",
        secs(baseline_time),
        baseline.writes()
    );
    println!(
        "| operator time / baseline time | {:.2} |",
        secs(converged) / secs(baseline_time)
    );
    println!(
        "| operator writes / baseline writes | {:.2} |",
        convergence.writes() as f64 / baseline.writes().max(1) as f64
    );
    println!(
        "convergence requests by verb and resource: {:?}",
        convergence.0
    );
    println!("steady-state requests: {:?}", steady.0);
    let report = json!({
        "clusters": n, "namespaces": namespaces.len(), "replicas": args.replicas,
        "max_concurrent_reconciles": args.max_concurrent_reconciles,
        "created_s": secs(created), "children_applied_s": secs(children_at), "statuses_written_s": secs(converged),
        "reconciles": reconciled,
        "convergence_requests": convergence.requests(), "convergence_writes": convergence.writes(),
        "convergence_by_request": convergence.0,
        "requests_per_reconcile": per(convergence.requests(), reconciled),
        "writes_per_reconcile": per(convergence.writes(), reconciled),
        "steady_seconds": args.steady_seconds, "steady_writes": steady.writes(), "steady_requests": steady.0,
        "steady_resource_version_changes": steady_rv_changes,
        "spec_change_latency_ms": {"samples": latencies.len(), "p50": percentile(&latencies, 50.0), "p99": percentile(&latencies, 99.0)},
        "operator_rss_kib": rss,
        "operator_steady_rss_kib": at_steady.map(|u| u.rss_kib),
        "operator_peak_rss_kib": at_end.map(|u| u.peak_rss_kib),
        "operator_cpu_seconds": {"convergence": cpu_converge, "steady": cpu_steady, "spec_changes": cpu_changes},
        "seconds_per_1000": secs(converged) * 1000.0 / n as f64,
        "operator_exit": exit.map(|s| s.to_string()),
        "baseline_s": secs(baseline_time), "baseline_requests": baseline.0,
        "ratio_operator_to_baseline_time": secs(converged) / secs(baseline_time),
        "ratio_operator_to_baseline_writes": convergence.writes() as f64 / baseline.writes().max(1) as f64,
    });
    let json_path = if args.json.is_absolute() {
        args.json.clone()
    } else {
        cdn_operator_e2e::repository_root().join(&args.json)
    };
    if let Some(parent) = json_path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&json_path, serde_json::to_string_pretty(&report).unwrap())
        .expect("write the JSON report");
    println!("JSON: {}", json_path.display());
    ExitCode::SUCCESS
}
