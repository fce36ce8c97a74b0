//! The benchmark against the cluster of `KUBECONFIG`: N CdnClusters (a balancer in front of nine
//! caches per group of ten, over several namespaces) reconciled by the built operator, run out of
//! cluster behind a counting proxy. Prints a table, writes JSON, asserts no times. With no
//! reachable cluster: one line, exit 0.
//!
//! Measured:
//! - time until every child is applied and every status written (from the first create);
//! - API requests and writes per reconcile: the operator's requests by verb and resource as it
//!   counts them itself (its `rest_client_requests_total`), whose writes must agree with the
//!   count of the proxy every request passes (printed beside them; the run fails when they
//!   differ); reconciles from its `controller_runtime_reconcile_total`;
//! - writes during the steady state: the operator's and the proxy's write counts, and the
//!   resourceVersion changes of the CdnClusters and children seen by watches (target 0);
//! - latency from a spec change to the child updated (the ConfigMap, seen by a watch): p50, p99,
//!   the server's answers to the change and to the operator's writes meanwhile, and, for each
//!   change, when the proxy forwarded the operator's ConfigMap apply and how long it took;
//! - the operator's VmRSS after the steady state and at the end, its peak (VmHWM), and its CPU
//!   seconds in each phase (convergence, steady state, spec changes); the time per 1,000;
//! - the bare-client baseline: the same creates, sent as in the operator's phase, and the same
//!   writes (children and status applied, the Event created, through the operator's own apply and
//!   Event paths and the same proxy and concurrency) from one client that reads nothing, each
//!   CdnCluster written once it and its sources are created; timed from the first create, as the
//!   operator is; the ratio;
//! - why a phase took its time: the server's answer times to its writes (p50, p99) and how many
//!   writes were in flight on average, for the operator and the baseline; the operator's mean
//!   reconcile time and its reconciles over 1 s (its `controller_runtime_reconcile_time_seconds`);
//!   the operator's context switches per CdnCluster (its wake-ups, and its preemptions); the
//!   system part of its CPU and its minor page faults per CdnCluster; its CPU
//!   sampled every 2 s while it converges, fitted to a part paid per second whatever the progress
//!   and a part per CdnCluster converged.
//!
//! Here, [`run`] goes through the phases in order, each a function; the modules hold the rest:
//! `workload` (the CdnClusters and their namespaces, created and deleted), `watch` (what the
//! benchmark's watches see, and the waits on it), `cpu` (the operator's CPU and memory, sampled
//! and fitted), `latency` (the spec changes), `baseline` (the bare client), `metrics` (what is
//! read from the operator's /metrics), `report` (the table and the JSON, on top) and `stats`
//! (milliseconds, percentiles and answer times, which they all share: a leaf).

mod baseline;
mod cpu;
mod latency;
mod metrics;
mod report;
mod stats;
mod watch;
mod workload;

use baseline::{run_baseline, Baseline};
use cdn_operator::api::CdnCluster;
use cdn_operator_e2e::canary::{Canary, Cost};
use cdn_operator_e2e::proxy::{Counts, Proxy};
use cdn_operator_e2e::{connect, install_crds, NamespaceGuard, Operator, OperatorOptions, Usage};
use clap::Parser;
use cpu::{idle_cost, sample_cpu, ConvergenceCpu, Usages};
use futures::StreamExt;
use kube::{Client, Config};
use latency::spec_changes;
use metrics::{writes_agree, Reconciles, Requests};
use report::Report;
use stats::Answers;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};
use watch::{settle, wait_for, Watches};
use workload::{
    await_namespaces_gone, create_all, create_namespaces, delete_all, manifests, Names, BENCH_LABEL,
};

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
    /// Run the bare-client baseline before the operator, not after: whether a phase's place in
    /// the run (a server just started, or one that has just deleted the other phase's objects)
    /// weighs on the ratio. Not with --keep: the operator would reconcile the baseline's objects.
    #[arg(long, conflicts_with = "keep")]
    baseline_first: bool,
    /// Print the CdnClusters a run would create (`--clusters` over `--namespaces`) as YAML, in
    /// the namespaces `<PREFIX>-0`, `<PREFIX>-1`, … and without the benchmark's label, then exit
    /// without connecting: the objects `e2e/ballast.sh` loads a server with.
    #[arg(long, value_name = "PREFIX")]
    print_manifests: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(prefix) = &args.print_manifests {
        return workload::print_manifests(prefix, args.clusters, args.namespaces, args.replicas);
    }
    let Some(client) = connect("cdn-operator benchmark").await else {
        return ExitCode::SUCCESS;
    };
    install_crds(&client).await;
    // An earlier run's namespaces are deleted after it ends, and an operator started meanwhile
    // would list and reconcile their CdnClusters too.
    let earlier = "namespaces of earlier runs";
    let limit = Duration::from_secs(1800);
    if let Err(error) = await_namespaces_gone(&client, BENCH_LABEL, earlier, limit).await {
        eprintln!("bench: {error} (kept with --keep?)");
        return ExitCode::FAILURE;
    }
    let names = Names::new(args.namespaces);
    let _guard = NamespaceGuard {
        namespaces: names
            .namespaces
            .iter()
            .chain(&names.baseline_namespaces)
            .cloned()
            .collect(),
        keep: args.keep,
    };
    match run(&client, &args, &names).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The benchmark, phase by phase, in the namespaces of `names`: the operator's phases
/// (convergence, steady state, spec changes), the baseline (before them with
/// `--baseline-first`), the report.
async fn run(client: &Client, args: &Args, names: &Names) -> Result<(), String> {
    create_namespaces(client, &names.namespaces, &names.run).await;
    let ours: Arc<HashSet<String>> = Arc::new(names.namespaces.iter().cloned().collect());
    let dir = tempfile::tempdir().expect("temporary directory");
    // The operator counts its requests itself (`rest_client_requests_total`), and the figures
    // read their counts there; its requests still pass the counting proxy, for what the metric
    // cannot tell: each write's answer time (the server's answers to the operator's writes while
    // it converges and during the spec changes), when each write was forwarded (the path of a
    // spec change to the operator's ConfigMap apply), when the operator went quiet (`settle`),
    // the bare-client baseline's requests and answer times (no operator counts those), and the
    // check that both counts of the operator's writes agree.
    let proxy = Proxy::start(client.clone())
        .await
        .expect("the counting proxy");
    let bare = client_through(&proxy, dir.path()).await;
    // Watching from here on, so that the server serves these watches in both phases alike (they
    // see the baseline's objects too, and count the operator's only).
    let watches = Watches::start(client, &ours);
    if !watches.listed(Duration::from_secs(60)).await {
        return Err("the benchmark's watches did not list within 60s".into());
    }
    let first = if args.baseline_first {
        Some(baseline_before_the_operator(client, &proxy, &bare, names, args).await?)
    } else {
        None
    };

    // The operator's phases.
    let (operator, settled) = start_operator(&proxy, dir.path(), args).await?;
    let before_operator = settled.before_operator.clone();
    let convergence = converge(client, &proxy, &watches, &operator, settled, names, args).await?;
    let seconds = args.steady_seconds;
    let steady =
        observe_steady_state(&proxy, &before_operator, &watches, &operator, seconds).await?;
    let manifests = &convergence.manifests;
    let changes = spec_changes(client, &proxy, &watches, manifests, args.latency_samples).await;
    let (at_end, exit) = stop(operator).await;

    let baseline = match first {
        Some(baseline) => baseline,
        None => baseline_after_the_operator(client, &proxy, &bare, names, args).await?,
    };

    let usages = Usages {
        at_start: convergence.at_start,
        at_converged: convergence.at_converged,
        at_steady: steady.usage,
        at_end,
        bench_at_start: convergence.bench_at_start,
        bench_at_converged: convergence.bench_at_converged,
    };
    let report = Report {
        args,
        namespaces: names.namespaces.len(),
        convergence: &convergence,
        steady: &steady,
        changes: &changes,
        usages: &usages,
        exit,
        baseline: &baseline,
    };
    report.print();
    report.write_json();
    writes_agree(&[
        ("convergence", &convergence.requests),
        ("steady state", &steady.requests),
    ])
}

/// Says at once when the operator's and the proxy's counts of its writes in `phase` differ (the
/// run fails at its end).
fn warn_if_differ(phase: &str, requests: &Requests) {
    for disagreement in requests.disagreements() {
        eprintln!("bench: the write counts differ during {phase}: {disagreement}");
    }
}

/// `--baseline-first`: the baseline, then its namespaces deleted before the operator starts.
async fn baseline_before_the_operator(
    client: &Client,
    proxy: &Proxy,
    bare: &Client,
    names: &Names,
    args: &Args,
) -> Result<Baseline, String> {
    let (namespaces, label) = (&names.baseline_namespaces, &names.base_label);
    let baseline = run_baseline(client, proxy, bare, (namespaces, label), args).await;
    eprintln!("bench: deleting the baseline's namespaces before the operator starts");
    let what = "namespaces of the baseline";
    let limit = Duration::from_secs(args.timeout_seconds);
    delete_all(client, namespaces, label, what, limit).await?;
    Ok(baseline)
}

/// The baseline, unless it ran first: the same writes from one client, no operator running, on
/// the server as the operator found it: the operator's objects are deleted first (kept with
/// --keep), as they would weigh on the server the baseline measures.
async fn baseline_after_the_operator(
    client: &Client,
    proxy: &Proxy,
    bare: &Client,
    names: &Names,
    args: &Args,
) -> Result<Baseline, String> {
    if !args.keep {
        eprintln!("bench: deleting the operator's namespaces before the baseline");
        let what = "namespaces of the operator";
        let limit = Duration::from_secs(args.timeout_seconds);
        delete_all(client, &names.namespaces, &names.run, what, limit).await?;
    }
    let phase = (
        names.baseline_namespaces.as_slice(),
        names.base_label.as_str(),
    );
    Ok(run_baseline(client, proxy, bare, phase, args).await)
}

/// A client whose requests go through `proxy` (its kubeconfig written in `dir`).
async fn client_through(proxy: &Proxy, dir: &Path) -> Client {
    Client::try_from(
        Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(proxy.kubeconfig(dir)).expect("proxy kubeconfig"),
            &Default::default(),
        )
        .await
        .expect("proxy config"),
    )
    .expect("client")
}

/// What was read of the operator once started and settled, before the CdnClusters are created;
/// and the canary, started before it, with its idle cost.
struct Settled {
    canary: Canary,
    idle: Option<Cost>,
    /// The proxy's counts before the operator started.
    before_operator: Counts,
    requests: Requests,
    reconciles: Option<Reconciles>,
    usage: Option<Usage>,
    bench_usage: Option<Usage>,
}

/// Starts the operator, cluster-wide, its requests through `proxy`, and waits until it is quiet.
async fn start_operator(
    proxy: &Proxy,
    dir: &Path,
    args: &Args,
) -> Result<(Operator, Settled), String> {
    let options = OperatorOptions {
        namespace: None,
        lease: None,
        kubeconfig: Some(proxy.kubeconfig(dir)),
        args: vec![format!(
            "--max-concurrent-reconciles={}",
            args.max_concurrent_reconciles
        )],
    };
    let canary = Canary::start();
    let before_operator = proxy.counts();
    let operator = options.start("bench").await;
    settle(proxy, Duration::from_secs(2), Duration::from_secs(60)).await;
    // The canary's idle cost: the operator settled, nothing created yet.
    let idle = idle_cost(&canary).await;
    let requests = Requests::take(proxy, &before_operator, &operator).await?;
    let settled = Settled {
        canary,
        idle,
        before_operator,
        requests,
        reconciles: Reconciles::of(&operator),
        usage: operator.usage(),
        bench_usage: Usages::myself(),
    };
    Ok((operator, settled))
}

/// What the convergence measured: from the first create, when the creates were sent, every
/// child applied, every status written; the operator's CPU meanwhile; the server's answers to
/// its writes; its requests and reconciles until it went quiet again; the operator's and the
/// benchmark's use of the machine at both ends.
struct Convergence {
    manifests: Vec<CdnCluster>,
    created: Duration,
    children_at: Duration,
    converged: Duration,
    cpu: ConvergenceCpu,
    operator_answers: Answers,
    requests: Requests,
    reconciles: Option<Reconciles>,
    at_start: Option<Usage>,
    at_converged: Option<Usage>,
    bench_at_start: Option<Usage>,
    bench_at_converged: Option<Usage>,
}

/// Creates the CdnClusters and waits until the operator has applied every child and written
/// every status, then until it is quiet.
async fn converge(
    client: &Client,
    proxy: &Proxy,
    watches: &Watches,
    operator: &Operator,
    settled: Settled,
    names: &Names,
    args: &Args,
) -> Result<Convergence, String> {
    let n = args.clusters;
    let manifests = manifests(n, &names.namespaces, args.replicas);
    eprintln!(
        "bench: creating {n} CdnClusters in {} namespaces",
        names.namespaces.len()
    );
    let start = Instant::now();
    let writes_at_start = proxy.writes_answered();
    let cpu_sampling = sample_cpu(operator.pid(), watches.clusters.clone(), start);
    create_all(client, &manifests).for_each(|_| async {}).await;
    let created = start.elapsed();
    let deadline = start + Duration::from_secs(args.timeout_seconds);
    let mut children_at = None;
    let converged = wait_for(&watches.tick, deadline, || {
        if children_at.is_none() && watches.children_present(n) {
            children_at = Some(start.elapsed());
        }
        children_at.is_some() && watches.clusters.done() >= n
    })
    .await;
    if !converged {
        return Err(format!(
            "not converged after {}s: {}/{n} statuses, {}/{}/{} children\n{}",
            args.timeout_seconds,
            watches.clusters.done(),
            watches.deployments.present(),
            watches.config_maps.present(),
            watches.services.present(),
            operator.logs()
        ));
    }
    let converged = start.elapsed();
    let samples = cpu_sampling.stop().await;
    let canary = (&settled.canary, settled.idle);
    let cpu = ConvergenceCpu::of(samples, canary, start, converged, n);
    drop(settled.canary);
    let operator_answers = Answers::of(&proxy.write_times_since(writes_at_start), converged);
    let children_at = children_at.unwrap_or(converged);
    eprintln!("bench: converged in {converged:?}; waiting for the operator to go quiet");
    // Events follow the status write of each reconcile: count them too.
    settle(proxy, Duration::from_secs(5), Duration::from_secs(120)).await;
    let at_converged = operator.usage();
    let bench_at_converged = Usages::myself();
    let requests = Requests::take(proxy, &settled.before_operator, operator)
        .await?
        .since(&settled.requests);
    warn_if_differ("the convergence", &requests);
    let reconciles = match (settled.reconciles, Reconciles::of(operator)) {
        (Some(before), Some(after)) => Some(after.since(before)),
        _ => None,
    };
    Ok(Convergence {
        manifests,
        created,
        children_at,
        converged,
        cpu,
        operator_answers,
        requests,
        reconciles,
        at_start: settled.usage,
        at_converged,
        bench_at_start: settled.bench_usage,
        bench_at_converged,
    })
}

/// What the steady state measured: the operator's requests, the resourceVersion changes the
/// benchmark's watches saw (any writer), the operator's use of the machine at its end.
struct Steady {
    requests: Requests,
    rv_changes: u64,
    usage: Option<Usage>,
}

/// Watches the converged operator for `seconds`, changing nothing.
async fn observe_steady_state(
    proxy: &Proxy,
    before_operator: &Counts,
    watches: &Watches,
    operator: &Operator,
    seconds: u64,
) -> Result<Steady, String> {
    eprintln!("bench: observing the steady state for {seconds}s");
    let steady_start = Requests::take(proxy, before_operator, operator).await?;
    let changes_before = watches.changes();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let usage = operator.usage();
    let rv_changes = watches.changes() - changes_before;
    let requests = Requests::take(proxy, before_operator, operator)
        .await?
        .since(&steady_start);
    warn_if_differ("the steady state", &requests);
    Ok(Steady {
        requests,
        rv_changes,
        usage,
    })
}

/// Stops the operator: its use of the machine at the end, and its exit.
async fn stop(mut operator: Operator) -> (Option<Usage>, Option<ExitStatus>) {
    let at_end = operator.usage();
    operator.terminate();
    let exit = operator.exit_within(Duration::from_secs(30)).await;
    (at_end, exit)
}
