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

use cdn_operator::api::{CdnCluster, Role, State};
use cdn_operator::apply::Change;
use cdn_operator::cdncluster::nginx::Upstream;
use cdn_operator::cdncluster::sources::Problem;
use cdn_operator::cdncluster::status::{self, ChildChange, Observed};
use cdn_operator::cdncluster::{build, sources};
use cdn_operator::compact::Compact;
use cdn_operator::events::Events;
use cdn_operator_e2e::canary::{self, Canary};
use cdn_operator_e2e::proxy::{LoggedWrite, Proxy};
use cdn_operator_e2e::{
    connect, delete_namespace, install_crds, NamespaceGuard, Operator, OperatorOptions,
};
use clap::Parser;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config, Resource, ResourceExt};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

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

/// What the benchmark's watch of one kind has seen of the objects in its namespaces, kept up to
/// date as events arrive. The benchmark shares the machine with what it measures, so it keeps no
/// objects and scans none: each one's resourceVersion and whether it is done (for CdnClusters, a
/// status written for the generation) are all it needs.
#[derive(Default)]
struct Seen(Mutex<Objects>);

#[derive(Default)]
struct Objects {
    /// `namespace/name` → resourceVersion and done.
    versions: HashMap<String, (String, bool)>,
    done: usize,
    /// resourceVersion changes (creations and deletions too) since the watch began.
    changes: u64,
    /// The first list is in.
    listed: bool,
    /// The keys listed so far while the watch lists again: the others are gone at its end.
    relisting: Option<HashSet<String>>,
}

impl Objects {
    fn apply(&mut self, key: String, version: String, done: bool) {
        match self.versions.insert(key, (version.clone(), done)) {
            Some((before, was_done)) => {
                self.changes += u64::from(before != version);
                self.done -= usize::from(was_done);
            }
            None => self.changes += 1,
        }
        self.done += usize::from(done);
    }

    fn remove(&mut self, key: &str) {
        if let Some((_, was_done)) = self.versions.remove(key) {
            self.changes += 1;
            self.done -= usize::from(was_done);
        }
    }
}

impl Seen {
    fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.0.lock().expect("not poisoned")
    }

    fn present(&self) -> usize {
        self.objects().versions.len()
    }

    fn done(&self) -> usize {
        self.objects().done
    }

    fn changes(&self) -> u64 {
        self.objects().changes
    }

    fn listed(&self) -> bool {
        self.objects().listed
    }

    fn version(&self, key: &str) -> Option<String> {
        self.objects().versions.get(key).map(|(v, _)| v.clone())
    }

    fn record<K: Resource>(
        &self,
        event: watcher::Event<K>,
        ours: &HashSet<String>,
        done: fn(&K) -> bool,
    ) {
        let key = |obj: &K| {
            let meta = obj.meta();
            let ns = meta.namespace.as_deref().filter(|ns| ours.contains(*ns))?;
            Some((
                format!("{ns}/{}", meta.name.as_deref()?),
                meta.resource_version.clone().unwrap_or_default(),
            ))
        };
        let mut objects = self.objects();
        match event {
            watcher::Event::Init => objects.relisting = Some(HashSet::new()),
            watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
                if let Some((key, version)) = key(&obj) {
                    if let Some(listed) = objects.relisting.as_mut() {
                        listed.insert(key.clone());
                    }
                    objects.apply(key, version, done(&obj));
                }
            }
            watcher::Event::Delete(obj) => {
                if let Some((key, _)) = key(&obj) {
                    objects.remove(&key);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = objects.relisting.take() {
                    let gone: Vec<String> = objects
                        .versions
                        .keys()
                        .filter(|k| !listed.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        objects.remove(&key);
                    }
                }
                objects.listed = true;
            }
        }
    }
}

/// Follows `events` of the objects in `ours` (namespaces), ticking `tick` on each event.
fn track<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    ours: Arc<HashSet<String>>,
    done: fn(&K) -> bool,
    tick: Arc<watch::Sender<()>>,
) -> Arc<Seen>
where
    K: Resource + Send + 'static,
{
    let seen = Arc::new(Seen::default());
    let state = seen.clone();
    tokio::spawn(events.default_backoff().for_each(move |event| {
        if let Ok(event) = event {
            state.record(event, &ours, done);
            tick.send_replace(());
        }
        futures::future::ready(())
    }));
    seen
}

/// Follows the children of kind `K` in `ours`, read as the operator reads them.
fn track_children<K: Resource<DynamicType = ()> + 'static>(
    client: &Client,
    children: &watcher::Config,
    ours: &Arc<HashSet<String>>,
    tick: &Arc<watch::Sender<()>>,
) -> Arc<Seen> {
    let api = Api::<Compact<K>>::all(client.clone());
    track(
        watcher(api, children.clone()),
        ours.clone(),
        every,
        tick.clone(),
    )
}

/// Every child counts as done once it exists.
fn every<K>(_: &K) -> bool {
    true
}

/// Waits until `ready` holds, woken by `tick`, or `limit` passes; false then.
async fn wait_for(
    tick: &watch::Sender<()>,
    limit: Instant,
    mut ready: impl FnMut() -> bool,
) -> bool {
    let mut ticks = tick.subscribe();
    loop {
        ticks.borrow_and_update();
        if ready() {
            return true;
        }
        if Instant::now() > limit {
            return false;
        }
        // Woken at least each second to see the limit pass.
        let _ = tokio::time::timeout(Duration::from_secs(1), ticks.changed()).await;
    }
}

/// When `ready` first held, in milliseconds from `since` ([`wait_for`]); None past `limit`.
async fn seen_at(
    tick: &watch::Sender<()>,
    since: Instant,
    limit: Instant,
    ready: impl FnMut() -> bool,
) -> Option<f64> {
    wait_for(tick, limit, ready)
        .await
        .then(|| ms(since.elapsed()))
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

/// The server's answers to one phase's writes, as the proxy timed them.
#[derive(Debug, PartialEq, serde::Serialize)]
struct Answers {
    writes: usize,
    p50_ms: f64,
    p99_ms: f64,
    /// Writes in flight on average over the phase: their summed answer times over its length.
    /// Near the concurrency, the client kept the server busy; well below, it did not.
    in_flight: f64,
}

impl Answers {
    fn of(times: &[Duration], phase: Duration) -> Answers {
        let mut answers: Vec<f64> = times.iter().copied().map(ms).collect();
        answers.sort_by(|a, b| a.total_cmp(b));
        let busy: f64 = answers.iter().sum::<f64>() / 1000.0;
        Answers {
            writes: answers.len(),
            p50_ms: percentile(&answers, 50.0),
            p99_ms: percentile(&answers, 99.0),
            in_flight: busy / phase.as_secs_f64().max(f64::MIN_POSITIVE),
        }
    }
}

impl std::fmt::Display for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} writes, {:.1} ms / {:.1} ms, {:.1} in flight",
            self.writes, self.p50_ms, self.p99_ms, self.in_flight
        )
    }
}

/// The first write to `path` since `since` as the proxy logged it, waiting up to a second: it
/// logs a write once answered, which can come after a watch showed the write.
async fn logged_write(proxy: &Proxy, path: &str, since: Instant) -> Option<LoggedWrite> {
    let limit = Instant::now() + Duration::from_secs(1);
    loop {
        let write = proxy.first_write_to(path, since);
        if write.is_some() || Instant::now() > limit {
            return write;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One spec change, in milliseconds from its request: when the server answered it, when the
/// benchmark's own watch saw the change (about when the operator's did: the server sends both),
/// when the proxy forwarded the operator's ConfigMap apply, and how long that apply took to
/// answer. What remains of `total` is the ConfigMap's watch event reaching the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
struct ChangeSample {
    total: f64,
    change_answer: f64,
    event_seen: Option<f64>,
    apply_sent: Option<f64>,
    apply_answer: Option<f64>,
}

impl std::fmt::Display for ChangeSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_none = |v: Option<f64>| v.map_or("none".into(), |v| format!("{v:.1}"));
        write!(
            f,
            "{:.1} = {:.1}, {}, {}, {} ms",
            self.total,
            self.change_answer,
            or_none(self.event_seen),
            or_none(self.apply_sent),
            or_none(self.apply_answer)
        )
    }
}

/// Where the spec changes' time went: the change's watch event, the operator's reaction to it,
/// the server's answer to the operator's apply, and the three slowest changes.
#[derive(Debug, PartialEq, serde::Serialize)]
struct ChangePath {
    event_seen_p50: f64,
    event_seen_p99: f64,
    /// From the benchmark's sight of the change to the operator's apply forwarded: the
    /// operator's own part (with one hop through the proxy each way).
    reaction_p50: f64,
    reaction_p99: f64,
    apply_sent_p50: f64,
    apply_sent_p99: f64,
    apply_answer_p50: f64,
    apply_answer_p99: f64,
    /// Changes whose apply the proxy did not see (another writer's, or none).
    applies_missing: usize,
    slowest: Vec<ChangeSample>,
}

impl ChangePath {
    fn of(samples: &[ChangeSample]) -> ChangePath {
        let sorted = |pick: fn(&ChangeSample) -> Option<f64>| {
            let mut values: Vec<f64> = samples.iter().filter_map(pick).collect();
            values.sort_by(|a, b| a.total_cmp(b));
            values
        };
        let (sent, answer) = (sorted(|s| s.apply_sent), sorted(|s| s.apply_answer));
        let seen = sorted(|s| s.event_seen);
        let reaction = sorted(|s| Some(s.apply_sent? - s.event_seen?));
        let mut slowest = samples.to_vec();
        slowest.sort_by(|a, b| b.total.total_cmp(&a.total));
        slowest.truncate(3);
        ChangePath {
            event_seen_p50: percentile(&seen, 50.0),
            event_seen_p99: percentile(&seen, 99.0),
            reaction_p50: percentile(&reaction, 50.0),
            reaction_p99: percentile(&reaction, 99.0),
            apply_sent_p50: percentile(&sent, 50.0),
            apply_sent_p99: percentile(&sent, 99.0),
            apply_answer_p50: percentile(&answer, 50.0),
            apply_answer_p99: percentile(&answer, 99.0),
            applies_missing: samples.len() - sent.len(),
            slowest,
        }
    }
}

/// How often the operator's CPU is sampled while it converges ([`CpuFit`]).
const CPU_SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// The operator's CPU time and the CdnClusters converged, `seconds` after the first create.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
struct CpuSample {
    seconds: f64,
    cpu_seconds: f64,
    converged: usize,
}

/// One stretch of the convergence, cut by CdnClusters converged from the CPU samples: its pace,
/// the operator's CPU per CdnCluster, and how fast the machine ran then ([`canary`]: its task's
/// cost against its idle cost). Whether the CPU per CdnCluster grows with the CdnClusters held or
/// with the pace, and whether the machine slowed, shows stretch by stretch.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
struct Stretch {
    from: usize,
    to: usize,
    per_second: f64,
    cpu_ms_per_cluster: f64,
    /// The canary's loads and arithmetic against their idle cost, when it ran in the stretch.
    canary: Option<(f64, f64)>,
    #[serde(skip)]
    seconds: (f64, f64),
}

impl Stretch {
    /// The stretches of at least `step` CdnClusters each (the last may be shorter), from the
    /// samples' boundaries.
    fn of(samples: &[CpuSample], step: usize) -> Vec<Stretch> {
        let mut stretches = Vec::new();
        let Some(mut from) = samples.first().copied() else {
            return stretches;
        };
        for (i, sample) in samples.iter().enumerate().skip(1) {
            let last = i == samples.len() - 1;
            let done = sample.converged.saturating_sub(from.converged);
            if done >= step.max(1) || (last && done > 0) {
                let seconds = sample.seconds - from.seconds;
                stretches.push(Stretch {
                    from: from.converged,
                    to: sample.converged,
                    per_second: done as f64 / seconds.max(f64::MIN_POSITIVE),
                    cpu_ms_per_cluster: (sample.cpu_seconds - from.cpu_seconds) * 1000.0
                        / done as f64,
                    canary: None,
                    seconds: (from.seconds, sample.seconds),
                });
                from = *sample;
            }
        }
        stretches
    }
}

impl std::fmt::Display for Stretch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}–{}: {:.2} ms at {:.1}/s",
            self.from, self.to, self.cpu_ms_per_cluster, self.per_second
        )?;
        if let Some((loads, arithmetic)) = self.canary {
            write!(f, " (canary {loads:.2}×/{arithmetic:.2}×)")?;
        }
        Ok(())
    }
}

/// The operator's CPU over the convergence, taken apart by least squares over the sampling
/// intervals: `cpu = per_second × length + per_cluster × CdnClusters converged` (no constant: an
/// empty interval costs nothing). A part paid per second whatever the progress makes the CPU
/// grow with the length of the run, not with the work alone: at 10,000 the server converges
/// each 1,000 more slowly than at 1,000. A cost per CdnCluster that grows as the pace falls fits
/// as a part per second too: a run with the server slowed tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
struct CpuFit {
    per_second_ms: f64,
    per_cluster_ms: f64,
    /// The share of the intervals' CPU variance the two terms explain.
    r2: f64,
    intervals: usize,
}

impl CpuFit {
    /// None with fewer than three intervals, or when length and progress move together so
    /// closely that the two cannot be told apart.
    fn of(samples: &[CpuSample]) -> Option<CpuFit> {
        let intervals: Vec<[f64; 3]> = samples
            .windows(2)
            .map(|w| {
                [
                    w[1].seconds - w[0].seconds,
                    w[1].converged as f64 - w[0].converged as f64,
                    w[1].cpu_seconds - w[0].cpu_seconds,
                ]
            })
            .collect();
        if intervals.len() < 3 {
            return None;
        }
        let sum = |f: fn(&[f64; 3]) -> f64| intervals.iter().map(f).sum::<f64>();
        let (tt, tc, cc) = (
            sum(|i| i[0] * i[0]),
            sum(|i| i[0] * i[1]),
            sum(|i| i[1] * i[1]),
        );
        let (ty, cy) = (sum(|i| i[0] * i[2]), sum(|i| i[1] * i[2]));
        let det = tt * cc - tc * tc;
        if det <= 1e-9 * tt * cc {
            return None;
        }
        let per_second = (cc * ty - tc * cy) / det;
        let per_cluster = (tt * cy - tc * ty) / det;
        let mean = sum(|i| i[2]) / intervals.len() as f64;
        let total = sum(|i| i[2] * i[2]) - mean * mean * intervals.len() as f64;
        let residual: f64 = intervals
            .iter()
            .map(|i| (i[2] - per_second * i[0] - per_cluster * i[1]).powi(2))
            .sum();
        Some(CpuFit {
            per_second_ms: per_second * 1000.0,
            per_cluster_ms: per_cluster * 1000.0,
            r2: if total > 0.0 {
                1.0 - residual / total
            } else {
                0.0
            },
            intervals: intervals.len(),
        })
    }
}

impl std::fmt::Display for CpuFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} ms per second + {:.2} ms per CdnCluster (R² {:.2}, {} intervals)",
            self.per_second_ms, self.per_cluster_ms, self.r2, self.intervals
        )
    }
}

/// The sampling task of [`sample_cpu`], which keeps its samples until [`CpuSampling::stop`].
struct CpuSampling {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<CpuSample>>,
}

impl CpuSampling {
    /// Stops sampling and returns the samples, the last one taken now.
    async fn stop(self) -> Vec<CpuSample> {
        let _ = self.stop.send(());
        self.task.await.expect("the CPU sampling task")
    }
}

/// Samples the operator's CPU and the CdnClusters converged (`seen` done) every
/// [`CPU_SAMPLE_EVERY`] from now on, and once more when stopped.
fn sample_cpu(pid: u32, seen: Arc<Seen>, start: Instant) -> CpuSampling {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut every = tokio::time::interval(CPU_SAMPLE_EVERY);
        loop {
            let last = tokio::select! {
                _ = every.tick() => false,
                _ = &mut stopped => true,
            };
            samples.extend(cpu_sample(pid, &seen, start));
            if last {
                return samples;
            }
        }
    });
    CpuSampling { stop, task }
}

fn cpu_sample(pid: u32, seen: &Seen, start: Instant) -> Option<CpuSample> {
    Some(CpuSample {
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: cdn_operator_e2e::Usage::of(pid)?.cpu_seconds,
        converged: seen.done(),
    })
}

/// The operator's CdnCluster reconciles so far: how many (`controller_runtime_reconcile_total`),
/// and their time (`controller_runtime_reconcile_time_seconds`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Reconciles {
    count: f64,
    seconds: f64,
    over_1s: f64,
}

impl Reconciles {
    fn of(operator: &Operator) -> Option<Reconciles> {
        let labels = "controller=\"cdncluster\"";
        let metric = |name: &str, labels: &str| operator.metric_sum(name, labels);
        let time = "controller_runtime_reconcile_time_seconds";
        let timed = metric(&format!("{time}_count"), labels)?;
        let within_1s = metric(&format!("{time}_bucket"), &format!("le=\"1.0\",{labels}"))?;
        Some(Reconciles {
            count: metric("controller_runtime_reconcile_total", labels)?,
            seconds: metric(&format!("{time}_sum"), labels)?,
            over_1s: timed - within_1s,
        })
    }

    fn since(self, before: Reconciles) -> Reconciles {
        Reconciles {
            count: self.count - before.count,
            seconds: self.seconds - before.seconds,
            over_1s: self.over_1s - before.over_1s,
        }
    }

    fn mean_ms(self) -> f64 {
        self.seconds * 1000.0 / self.count
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

/// What the bare-client baseline took: its time from the first create, and from its first write
/// (how it was timed before the creates counted), its requests, the server's answers to its
/// writes.
struct Baseline {
    time: Duration,
    from_first_write: Duration,
    requests: cdn_operator_e2e::proxy::Counts,
    answers: Answers,
}

/// The order of the baseline's work: each CdnCluster as its create answered, once every
/// CdnCluster it names as a source has been created too, as the operator waits for its sources.
#[derive(Default)]
struct Ready {
    created: HashMap<(String, String), Arc<CdnCluster>>,
    waiting: Vec<Arc<CdnCluster>>,
}

impl Ready {
    /// The CdnClusters `created` makes ready (itself, and those that waited for it), with their
    /// sources resolved.
    fn arrived(&mut self, created: CdnCluster) -> Vec<(Arc<CdnCluster>, Vec<Upstream>)> {
        let created = Arc::new(created);
        let key = (created.namespace().unwrap_or_default(), created.name_any());
        self.created.insert(key, created.clone());
        self.waiting.push(created);
        let (all, mut ready) = (&self.created, Vec::new());
        self.waiting.retain(|cluster| {
            let ns = cluster.namespace().unwrap_or_default();
            let lookup = |name: &str| all.get(&(ns.clone(), name.to_string())).cloned();
            match sources::resolve(
                cluster,
                lookup,
                cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
            ) {
                Ok(upstreams) => {
                    ready.push((cluster.clone(), upstreams));
                    false
                }
                Err(Problem::Missing(_)) => true,
                Err(Problem::Invalid(why)) => panic!("{}: {why}", cluster.name_any()),
            }
        });
        ready
    }
}

/// The baseline: the user's creates and the operator's writes for the same CdnClusters
/// (children, then status, then the Event, through its own apply and Event paths), into fresh
/// namespaces labelled `label`. The creates go as in the operator's phase (`create_all`, on
/// their own, timed from the first); one client, `bare`, writes for each CdnCluster as soon as
/// it is ready (`Ready`), through the proxy at the operator's concurrency. It reads nothing: the
/// CdnClusters are as their creation answered them, as the operator finds them in its cache.
async fn run_baseline(
    client: &Client,
    proxy: &Proxy,
    bare: &Client,
    (namespaces, label): (&[String], &str),
    args: &Args,
) -> Baseline {
    eprintln!("bench: baseline");
    create_namespaces(client, namespaces, label).await;
    let manifests: Vec<CdnCluster> = (0..args.clusters)
        .map(|i| manifest(i, namespaces, args.replicas))
        .collect();
    let events = Events::new(bare.clone(), None);
    let counts_at_start = proxy.counts();
    let writes_mark = proxy.writes_answered();
    let (ready_tx, ready_rx) = futures::channel::mpsc::unbounded();
    let start = Instant::now();
    let creates = tokio::spawn({
        let client = client.clone();
        async move {
            let mut order = Ready::default();
            let mut created = std::pin::pin!(create_all(&client, &manifests));
            while let Some(cluster) = created.next().await {
                for ready in order.arrived(cluster) {
                    ready_tx
                        .unbounded_send(ready)
                        .expect("the baseline's writer");
                }
            }
            order.waiting.len()
        }
    });
    let first_write = std::sync::OnceLock::new();
    ready_rx
        .for_each_concurrent(
            args.max_concurrent_reconciles as usize,
            |(cluster, upstreams)| {
                let (events, first_write) = (&events, &first_write);
                async move {
                    first_write.get_or_init(Instant::now);
                    let cluster: &CdnCluster = &cluster;
                    let ns = cluster.namespace().unwrap();
                    let kids = build::children(cluster, &upstreams, &Default::default());
                    let changes: Vec<ChildChange> = [
                        kids.config_map.object_ref(&()),
                        kids.service.object_ref(&()),
                        kids.deployment.object_ref(&()),
                    ]
                    .into_iter()
                    .map(|child| ChildChange {
                        child,
                        change: Change::Created,
                    })
                    .collect();
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
                    let observed = Observed::Deployed(Some(&deployment));
                    let now = Time(jiff::Timestamp::now());
                    let status = status::desired(cluster, observed, &now);
                    let notices = status::notices(cluster, &status, &observed, &changes);
                    cdn_operator::apply::apply_status(
                        &Api::<CdnCluster>::namespaced(bare.clone(), &ns),
                        cluster,
                        None,
                        &status,
                    )
                    .await
                    .expect("status");
                    for notice in notices {
                        events.publish(cluster, notice).await;
                    }
                }
            },
        )
        .await;
    let end = Instant::now();
    let time = end - start;
    let never_ready = creates.await.expect("the baseline's creates");
    assert_eq!(
        never_ready, 0,
        "CdnClusters whose sources were never created"
    );
    let from_first_write = first_write.get().map_or(time, |at| end - *at);
    Baseline {
        time,
        from_first_write,
        requests: proxy.counts().since(&counts_at_start),
        answers: Answers::of(&proxy.write_times_since(writes_mark), time),
    }
}

/// Deletes `namespaces`, all labelled `label`, and waits until they are gone: what one phase
/// created must not weigh on the server while the other is measured.
async fn delete_all(
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

async fn create_namespaces(client: &Client, names: &[String], label: &str) {
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
fn create_all<'a>(
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

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(prefix) = &args.print_manifests {
        let namespaces: Vec<String> = (0..args.namespaces)
            .map(|i| format!("{prefix}-{i}"))
            .collect();
        let yaml: String = (0..args.clusters)
            .map(|i| {
                let mut cluster = manifest(i, &namespaces, args.replicas);
                cluster.metadata.labels = None;
                let yaml = serde_yaml::to_string(&cluster).expect("a CdnCluster as YAML");
                format!("---\n{yaml}")
            })
            .collect();
        return cdn_operator::cli::print_out(&yaml);
    }
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
    // Labelled apart, so that each phase's namespaces can be awaited gone alone.
    let base_label = format!("{run}-base");
    create_namespaces(&client, &namespaces, &run).await;
    let ours: Arc<HashSet<String>> = Arc::new(namespaces.iter().cloned().collect());

    let dir = tempfile::tempdir().expect("temporary directory");
    let proxy = Proxy::start(client.clone())
        .await
        .expect("the counting proxy");
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
    // Watching from here on, so that the server serves these watches in both phases alike (they
    // see the baseline's objects too, and count the operator's only).
    let children = watcher::Config::default().labels("app.kubernetes.io/managed-by=cdn-operator");
    let tick = Arc::new(watch::Sender::new(()));
    let written = |c: &CdnCluster| {
        c.status.as_ref().is_some_and(|st| {
            st.observed_generation == c.metadata.generation
                && matches!(st.state, Some(State::Deploying | State::Running))
        })
    };
    let clusters_seen = track(
        watcher(
            Api::<CdnCluster>::all(client.clone()),
            watcher::Config::default().labels(&format!("{BENCH_LABEL}=true")),
        ),
        ours.clone(),
        written,
        tick.clone(),
    );
    let deployments = track_children::<Deployment>(&client, &children, &ours, &tick);
    let config_maps = track_children::<ConfigMap>(&client, &children, &ours, &tick);
    let services = track_children::<Service>(&client, &children, &ours, &tick);
    let seen = [&clusters_seen, &deployments, &config_maps, &services];
    let limit = Instant::now() + Duration::from_secs(60);
    if !wait_for(&tick, limit, || seen.iter().all(|s| s.listed())).await {
        eprintln!("bench: the benchmark's watches did not list within 60s");
        return ExitCode::FAILURE;
    }
    let deletion_limit = Duration::from_secs(args.timeout_seconds);
    let first = if args.baseline_first {
        let phase = (baseline_namespaces.as_slice(), base_label.as_str());
        let baseline = run_baseline(&client, &proxy, &bare, phase, &args).await;
        eprintln!("bench: deleting the baseline's namespaces before the operator starts");
        let what = "namespaces of the baseline";
        if let Err(error) = delete_all(
            &client,
            &baseline_namespaces,
            &base_label,
            what,
            deletion_limit,
        )
        .await
        {
            eprintln!("bench: {error}");
            return ExitCode::FAILURE;
        }
        Some(baseline)
    } else {
        None
    };
    let options = OperatorOptions {
        namespace: None,
        lease: None,
        kubeconfig: Some(proxy.kubeconfig(dir.path())),
        args: vec![format!(
            "--max-concurrent-reconciles={}",
            args.max_concurrent_reconciles
        )],
    };
    let canary = Canary::start();
    let mut operator = options.start("bench").await;
    settle(&proxy, Duration::from_secs(2), Duration::from_secs(60)).await;
    // The canary's idle cost: the operator settled, nothing created yet.
    let idle_from = Instant::now();
    while canary.taken_since(idle_from) < 8 {
        tokio::time::sleep(canary::EVERY).await;
    }
    let idle = canary.cost_between(idle_from, Instant::now());
    let startup = proxy.counts();
    let reconciles_before = Reconciles::of(&operator);
    let at_start = operator.usage();
    let myself = || cdn_operator_e2e::Usage::of(std::process::id());
    let bench_at_start = myself();

    let changes = || seen.iter().map(|s| s.changes()).sum::<u64>();

    // 1. Convergence.
    let manifests: Vec<CdnCluster> = (0..n)
        .map(|i| manifest(i, &namespaces, args.replicas))
        .collect();
    eprintln!(
        "bench: creating {n} CdnClusters in {} namespaces",
        namespaces.len()
    );
    let start = Instant::now();
    let writes_at_start = proxy.writes_answered();
    let cpu_sampling = sample_cpu(operator.pid(), clusters_seen.clone(), start);
    create_all(&client, &manifests).for_each(|_| async {}).await;
    let created = start.elapsed();
    let deadline = start + Duration::from_secs(args.timeout_seconds);
    let mut children_at = None;
    let converged = wait_for(&tick, deadline, || {
        let all = |seen: &Seen| seen.present() >= n;
        if children_at.is_none() && all(&deployments) && all(&config_maps) && all(&services) {
            children_at = Some(start.elapsed());
        }
        children_at.is_some() && clusters_seen.done() >= n
    })
    .await;
    let converged = if converged {
        start.elapsed()
    } else {
        eprintln!(
            "bench: not converged after {}s: {}/{n} statuses, {}/{}/{} children\n{}",
            args.timeout_seconds,
            clusters_seen.done(),
            deployments.present(),
            config_maps.present(),
            services.present(),
            operator.logs()
        );
        return ExitCode::FAILURE;
    };
    let cpu_samples = cpu_sampling.stop().await;
    let cpu_fit = CpuFit::of(&cpu_samples);
    let at = |seconds: f64| start + Duration::from_secs_f64(seconds);
    let against_idle = |from: f64, to: f64| {
        let cost = canary.cost_between(at(from), at(to))?;
        let against = cost.against(idle?);
        Some((against.loads_us, against.arithmetic_us))
    };
    let machine = against_idle(0.0, converged.as_secs_f64());
    let stretches: Vec<Stretch> = Stretch::of(&cpu_samples, (n / 10).max(100))
        .into_iter()
        .map(|s| Stretch {
            canary: against_idle(s.seconds.0, s.seconds.1),
            ..s
        })
        .collect();
    drop(canary);
    let operator_answers = Answers::of(&proxy.write_times_since(writes_at_start), converged);
    let children_at = children_at.unwrap_or(converged);
    eprintln!("bench: converged in {converged:?}; waiting for the operator to go quiet");
    // Events follow the status write of each reconcile: count them too.
    settle(&proxy, Duration::from_secs(5), Duration::from_secs(120)).await;
    let convergence = proxy.counts().since(&startup);
    let at_converged = operator.usage();
    let bench_at_converged = myself();
    let reconciles = match (reconciles_before, Reconciles::of(&operator)) {
        (Some(before), Some(after)) => Some(after.since(before)),
        _ => None,
    };
    let reconciled = reconciles.map(|r| r.count);

    // 2. Steady state.
    eprintln!(
        "bench: observing the steady state for {}s",
        args.steady_seconds
    );
    let steady_start = proxy.counts();
    let changes_before = changes();
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let steady = proxy.counts().since(&steady_start);
    let at_steady = operator.usage();
    let steady_rv_changes = changes() - changes_before;

    // 3. Spec change → ConfigMap updated.
    let caches: Vec<&CdnCluster> = manifests
        .iter()
        .filter(|c| c.spec.role == Role::Cache)
        .take(args.latency_samples)
        .collect();
    eprintln!("bench: timing {} spec changes", caches.len());
    let mut latencies = Vec::new();
    // Why a change took its time: the server's answer to the change itself, and to the
    // operator's writes meanwhile.
    let mut change_answers = Vec::new();
    // Each change's ConfigMap apply (when and to which path it was sent) is looked up in the
    // proxy's log once the changes are done, so that they go back to back whatever the log
    // holds yet.
    let mut changed = Vec::new();
    proxy.log_writes();
    let (changes_start, changes_mark) = (Instant::now(), proxy.writes_answered());
    for (k, cache) in caches.iter().enumerate() {
        let ns = cache.namespace().unwrap();
        let config_map_name = build::config_map_name(&cache.name_any());
        let config_map_path = format!("/api/v1/namespaces/{ns}/configmaps/{config_map_name}");
        let config_map = format!("{ns}/{config_map_name}");
        let before = config_maps.version(&config_map);
        let cluster = format!("{ns}/{}", cache.name_any());
        let cluster_before = clusters_seen.version(&cluster);
        let api: Api<CdnCluster> = Api::namespaced(client.clone(), &ns);
        let change = json!({"spec": {"cache": {"valid": format!("{}m", 11 + k)}}});
        let t = Instant::now();
        let limit = t + Duration::from_secs(60);
        // All three at once: the server's watch event can come before its answer.
        let answered = async {
            api.patch(
                &cache.name_any(),
                &PatchParams::default(),
                &Patch::Merge(change),
            )
            .await
            .expect("spec change");
            ms(t.elapsed())
        };
        let (change_answer, event_seen, updated) = tokio::join!(
            answered,
            seen_at(&tick, t, limit, || clusters_seen.version(&cluster)
                != cluster_before),
            seen_at(&tick, t, limit, || config_maps.version(&config_map)
                != before),
        );
        change_answers.push(change_answer);
        if let Some(total) = updated {
            latencies.push(total);
            let sample = ChangeSample {
                total,
                change_answer,
                event_seen,
                apply_sent: None,
                apply_answer: None,
            };
            changed.push((sample, t, config_map_path));
        } else {
            eprintln!("bench: {config_map} not updated within 60s");
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    change_answers.sort_by(|a, b| a.total_cmp(b));
    let mut samples = Vec::with_capacity(changed.len());
    for (mut sample, t, config_map_path) in changed {
        let apply = logged_write(&proxy, &config_map_path, t).await;
        sample.apply_sent = apply.as_ref().map(|a| ms(a.forwarded - t));
        sample.apply_answer = apply.map(|a| ms(a.answer));
        samples.push(sample);
    }
    let path = ChangePath::of(&samples);
    let operator_answers_to_changes = Answers::of(
        &proxy.write_times_since(changes_mark),
        changes_start.elapsed(),
    );
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
    // Each voluntary switch is a wake-up, after which the operator's data is no longer in the
    // caches the server's processes shared meanwhile; involuntary ones are preemptions.
    let convergence_usage = at_start.zip(at_converged);
    let switches = convergence_usage.map(|(from, to)| {
        (
            (to.switches.voluntary - from.switches.voluntary) as f64 / n as f64,
            (to.switches.involuntary - from.switches.involuntary) as f64 / n as f64,
        )
    });
    // The kernel's part: syscalls and the pages the allocator returns and touches again.
    let kernel = convergence_usage.map(|(from, to)| {
        (
            to.system_seconds - from.system_seconds,
            (to.minor_faults - from.minor_faults) as f64 / n as f64,
        )
    });
    let (cpu_converge, cpu_steady, cpu_changes) = (
        cpu(at_start, at_converged),
        cpu(at_converged, at_steady),
        cpu(at_steady, at_end),
    );
    operator.terminate();
    let exit = operator.exit_within(Duration::from_secs(30)).await;
    drop(operator);

    // 4. Baseline, unless it ran first: the same writes from one client, no operator running,
    // on the server as the operator found it: the operator's objects are deleted first (kept
    // with --keep), as they would weigh on the server the baseline measures.
    let baseline = match first {
        Some(baseline) => baseline,
        None => {
            if !args.keep {
                eprintln!("bench: deleting the operator's namespaces before the baseline");
                let what = "namespaces of the operator";
                if let Err(error) =
                    delete_all(&client, &namespaces, &run, what, deletion_limit).await
                {
                    eprintln!("bench: {error}");
                    return ExitCode::FAILURE;
                }
            }
            let phase = (baseline_namespaces.as_slice(), base_label.as_str());
            run_baseline(&client, &proxy, &bare, phase, &args).await
        }
    };

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
        "| why: spec changes: the server's answer to the change p50 / p99; to the operator's writes meanwhile | {:.1} ms / {:.1} ms; {operator_answers_to_changes} |",
        percentile(&change_answers, 50.0),
        percentile(&change_answers, 99.0)
    );
    println!(
        "| why: spec changes, p50 / p99 from the change: its watch event seen; the operator's ConfigMap apply forwarded; from the event to the apply; the apply's answer; the slowest (total = change answered, event seen, apply forwarded, its answer) | {:.1} / {:.1} ms; {:.1} / {:.1} ms; {:.1} / {:.1} ms; {:.1} / {:.1} ms; {} |",
        path.event_seen_p50, path.event_seen_p99, path.apply_sent_p50, path.apply_sent_p99,
        path.reaction_p50, path.reaction_p99, path.apply_answer_p50, path.apply_answer_p99,
        path.slowest.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    );
    println!(
        "| time per 1,000 CdnClusters (every status written) | {:.2} s |",
        secs(converged) * 1000.0 / n as f64
    );
    println!("| operator CPU: convergence | {} |", seconds(cpu_converge));
    println!("| operator CPU: steady state | {} |", seconds(cpu_steady));
    println!("| operator CPU: spec changes | {} |", seconds(cpu_changes));
    println!(
        "| benchmark process (creates, proxy, watches): CPU during convergence, peak VmRSS | {}, {} |",
        seconds(cpu(bench_at_start, bench_at_converged)),
        mib(bench_at_converged.map(|u| u.peak_rss_kib))
    );
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
        "| baseline: the creates and the same writes from one client{} | {:.2} s ({:.2} s from its first write), {} writes |",
        if args.baseline_first {
            ", run first"
        } else {
            ""
        },
        secs(baseline.time),
        secs(baseline.from_first_write),
        baseline.requests.writes()
    );
    println!(
        "| operator time / baseline time | {:.2} |",
        secs(converged) / secs(baseline.time)
    );
    println!(
        "| operator writes / baseline writes | {:.2} |",
        convergence.writes() as f64 / baseline.requests.writes().max(1) as f64
    );
    println!(
        "| why: operator reconciles during convergence: mean time; over 1 s | {} |",
        reconciles
            .map(|t| format!("{:.1} ms; {:.0}", t.mean_ms(), t.over_1s))
            .unwrap_or_else(|| "n/a".into())
    );
    println!(
        "| why: operator context switches per CdnCluster during convergence: voluntary / involuntary | {} |",
        switches
            .map(|(v, i)| format!("{v:.1} / {i:.1}"))
            .unwrap_or_else(|| "n/a".into())
    );
    println!(
        "| why: operator system CPU during convergence; minor page faults per CdnCluster | {} |",
        kernel
            .map(|(s, f)| format!("{s:.2} s; {f:.1}"))
            .unwrap_or_else(|| "n/a".into())
    );
    // The part paid per second, over the whole convergence.
    let per_second_part = cpu_fit.map(|f| f.per_second_ms * secs(converged) / 1000.0);
    println!(
        "| why: operator CPU during convergence, sampled every {} s and fitted: paid per second whatever the progress + per CdnCluster converged | {} |",
        CPU_SAMPLE_EVERY.as_secs(),
        cpu_fit.map_or("n/a".into(), |f| f.to_string())
    );
    println!(
        "| why: the machine's speed during convergence: a canary's fixed task (dependent loads through 16 MiB; arithmetic), its cost against idle | {} |",
        machine.map_or("n/a".into(), |(l, a)| format!("{l:.2}× / {a:.2}×"))
    );
    println!(
        "| why: operator CPU per CdnCluster by stretch of CdnClusters converged, at the stretch's pace (canary against idle) | {} |",
        stretches
            .iter()
            .map(Stretch::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "| why: the part paid per second, over the convergence | {} |",
        match (per_second_part, cpu_converge) {
            (Some(part), Some(all)) => format!("{part:.2} s of {all:.2} s"),
            _ => "n/a".into(),
        }
    );
    println!(
        "| why: server's answers to the operator's writes until converged: p50 / p99; in flight | {operator_answers} |"
    );
    println!(
        "| why: server's answers to the baseline's writes: p50 / p99; in flight | {} |",
        baseline.answers
    );
    println!(
        "convergence requests by verb and resource: {:?}",
        convergence.0
    );
    println!("steady-state requests: {:?}", steady.0);
    let mut report = json!({
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
        "spec_change_latency_ms": {"samples": latencies.len(), "p50": percentile(&latencies, 50.0), "p99": percentile(&latencies, 99.0),
            "change_answer_p50": percentile(&change_answers, 50.0), "change_answer_p99": percentile(&change_answers, 99.0),
            "operator_write_answers": operator_answers_to_changes, "path": path},
        "operator_rss_kib": rss,
        "operator_steady_rss_kib": at_steady.map(|u| u.rss_kib),
        "operator_peak_rss_kib": at_end.map(|u| u.peak_rss_kib),
        "operator_cpu_seconds": {"convergence": cpu_converge, "steady": cpu_steady, "spec_changes": cpu_changes},
        "benchmark_process": {"cpu_seconds_convergence": cpu(bench_at_start, bench_at_converged), "peak_rss_kib": bench_at_converged.map(|u| u.peak_rss_kib)},
        "seconds_per_1000": secs(converged) * 1000.0 / n as f64,
        "operator_exit": exit.map(|s| s.to_string()),
        "baseline_first": args.baseline_first,
        "baseline_s": secs(baseline.time), "baseline_from_first_write_s": secs(baseline.from_first_write), "baseline_requests": baseline.requests.0,
        "ratio_operator_to_baseline_time": secs(converged) / secs(baseline.time),
        "ratio_operator_to_baseline_writes": convergence.writes() as f64 / baseline.requests.writes().max(1) as f64,
        "reconcile_time": reconciles.map(|t| json!({"reconciles": t.count, "mean_ms": t.mean_ms(), "over_1s": t.over_1s})),
        "write_answers": {"operator": operator_answers, "baseline": baseline.answers},
        "operator_switches_per_cluster": switches.map(|(v, i)| json!({"voluntary": v, "involuntary": i})),
        "operator_kernel": kernel.map(|(s, f)| json!({"system_cpu_seconds_convergence": s, "minor_faults_per_cluster": f})),
        "operator_cpu_fit": cpu_fit.map(|f| json!({"fit": f, "per_second_part_s": per_second_part})),
        "operator_cpu_samples": cpu_samples,
    });
    // Beside the macro above, whose size meets the recursion limit.
    report["operator_cpu_by_stretch"] = json!(stretches);
    report["canary_against_idle"] =
        json!(machine.map(|(l, a)| json!({"loads": l, "arithmetic": a})));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(ns: &str, name: &str, version: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "resourceVersion": version}
        }))
        .unwrap()
    }

    fn has_data(c: &ConfigMap) -> bool {
        c.data.is_some()
    }

    /// Samples of an operator that spends `per_second` s each second and `per_cluster` s per
    /// CdnCluster, converging at `paces` CdnClusters per second, one interval each.
    fn samples(per_second: f64, per_cluster: f64, paces: &[usize]) -> Vec<CpuSample> {
        let mut sample = CpuSample {
            seconds: 0.0,
            cpu_seconds: 0.0,
            converged: 0,
        };
        let mut all = vec![sample];
        for &pace in paces {
            sample.seconds += 2.0;
            sample.converged += 2 * pace;
            sample.cpu_seconds += 2.0 * per_second + (2 * pace) as f64 * per_cluster;
            all.push(sample);
        }
        all
    }

    #[test]
    fn stretches_cut_the_convergence_by_cdnclusters_converged() {
        // 0.5 ms per CdnCluster at 50/s, 1 ms at 20/s.
        let mut all = samples(0.0, 0.0005, &[50, 50, 50]);
        let fast = *all.last().unwrap();
        for (k, sample) in samples(0.0, 0.001, &[20, 20, 20, 20])
            .into_iter()
            .enumerate()
            .skip(1)
        {
            all.push(CpuSample {
                seconds: fast.seconds + 2.0 * k as f64,
                cpu_seconds: fast.cpu_seconds + sample.cpu_seconds,
                converged: fast.converged + sample.converged,
            });
        }
        let stretches = Stretch::of(&all, 150);
        let cut: Vec<(usize, usize)> = stretches.iter().map(|s| (s.from, s.to)).collect();
        // At least 150 each, cut where the samples fall; the last one shorter.
        assert_eq!(cut, [(0, 200), (200, 380), (380, 460)]);
        let pace: Vec<f64> = stretches.iter().map(|s| s.per_second).collect();
        assert_eq!(pace, [50.0, 30.0, 20.0]);
        let cost = |s: &Stretch| (s.cpu_ms_per_cluster * 1000.0).round() / 1000.0;
        // The middle one holds 100 at 0.5 ms and 80 at 1 ms.
        assert_eq!(
            stretches.iter().map(cost).collect::<Vec<_>>(),
            [0.5, 0.722, 1.0]
        );
        assert_eq!(stretches[0].to_string(), "0–200: 0.50 ms at 50.0/s");
        assert!(Stretch::of(&all[..1], 150).is_empty());
    }

    #[test]
    fn the_cpu_fit_tells_a_cost_per_second_from_a_cost_per_cluster() {
        let fit = CpuFit::of(&samples(0.016, 0.0018, &[40, 35, 30, 20, 17])).unwrap();
        assert!((fit.per_second_ms - 16.0).abs() < 1e-6, "{fit}");
        assert!((fit.per_cluster_ms - 1.8).abs() < 1e-6, "{fit}");
        assert!(fit.r2 > 0.999_999, "{fit}");
        assert_eq!(fit.intervals, 5);
        // No cost per second: none is found.
        let fit = CpuFit::of(&samples(0.0, 0.0025, &[40, 10, 25])).unwrap();
        assert!(fit.per_second_ms.abs() < 1e-6, "{fit}");
        assert!((fit.per_cluster_ms - 2.5).abs() < 1e-6, "{fit}");
        // Noise lowers R².
        let mut noisy = samples(0.016, 0.0018, &[40, 35, 30, 20, 17, 25]);
        noisy[3].cpu_seconds += 0.05;
        assert!(CpuFit::of(&noisy).unwrap().r2 < 0.99);
    }

    #[test]
    fn the_cpu_fit_needs_three_intervals_whose_pace_varies() {
        assert_eq!(CpuFit::of(&samples(0.016, 0.0018, &[40, 30])), None);
        // A steady pace: a cost per second and a cost per CdnCluster look the same.
        assert_eq!(CpuFit::of(&samples(0.016, 0.0018, &[30, 30, 30, 30])), None);
        assert_eq!(CpuFit::of(&[]), None);
    }

    #[test]
    fn the_baseline_writes_a_balancer_once_its_caches_are_created() {
        let namespaces = ["a".to_string()];
        let mut order = Ready::default();
        let names = |ready: Vec<(Arc<CdnCluster>, Vec<Upstream>)>| {
            ready
                .into_iter()
                .map(|(c, upstreams)| (c.name_any(), upstreams.len()))
                .collect::<Vec<_>>()
        };
        // The balancer is created first, as in the operator's phase: it waits for its nine caches.
        assert_eq!(names(order.arrived(manifest(0, &namespaces, 1))), vec![]);
        for i in 1..9 {
            let cache = names(order.arrived(manifest(i, &namespaces, 1)));
            assert_eq!(cache, vec![(format!("c0-{i}"), 1)]);
        }
        assert_eq!(order.waiting.len(), 1);
        assert_eq!(
            names(order.arrived(manifest(9, &namespaces, 1))),
            vec![("b0".to_string(), 9), ("c0-9".to_string(), 1)]
        );
        assert!(order.waiting.is_empty());
    }

    #[test]
    fn answers_are_summarized_with_the_writes_in_flight() {
        let ms = |m: u64| Duration::from_millis(m);
        let times: Vec<Duration> = (1..=100).map(ms).collect();
        let answers = Answers::of(&times, Duration::from_secs(1));
        // 5,050 ms of answers over 1 s: about five writes at a time.
        assert_eq!(
            answers,
            Answers {
                writes: 100,
                p50_ms: 50.0,
                p99_ms: 99.0,
                in_flight: 5.05
            }
        );
        assert_eq!(
            answers.to_string(),
            "100 writes, 50.0 ms / 99.0 ms, 5.0 in flight"
        );
        let none = Answers::of(&[], Duration::from_secs(1));
        assert_eq!((none.writes, none.in_flight), (0, 0.0));
    }

    #[test]
    fn counts_what_the_watch_brings_in_its_namespaces_only() {
        let seen = Seen::default();
        let ours: HashSet<String> = ["a".to_string()].into();
        let record = |event| seen.record(event, &ours, has_data);
        record(watcher::Event::Init);
        record(watcher::Event::InitApply(config_map("a", "x", "1")));
        record(watcher::Event::InitApply(config_map("other", "y", "2")));
        assert!(!seen.listed());
        record(watcher::Event::InitDone);
        assert!(seen.listed());
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 0, 1));

        let mut done = config_map("a", "x", "3");
        done.data = Some(Default::default());
        record(watcher::Event::Apply(done.clone()));
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 1, 2));
        assert_eq!(seen.version("a/x").as_deref(), Some("3"));
        // The same version again (a re-list) is no change.
        record(watcher::Event::Apply(done));
        assert_eq!((seen.done(), seen.changes()), (1, 2));
        record(watcher::Event::Apply(config_map("other", "z", "4")));
        assert_eq!(seen.changes(), 2);

        record(watcher::Event::Apply(config_map("a", "w", "5")));
        record(watcher::Event::Delete(config_map("a", "w", "6")));
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 1, 4));
        assert_eq!(seen.version("a/w"), None);
    }

    #[test]
    fn a_new_list_drops_what_it_no_longer_holds() {
        let seen = Seen::default();
        let ours: HashSet<String> = ["a".to_string()].into();
        let record = |event| seen.record(event, &ours, every);
        record(watcher::Event::Init);
        record(watcher::Event::InitApply(config_map("a", "x", "1")));
        record(watcher::Event::InitApply(config_map("a", "y", "2")));
        record(watcher::Event::InitDone);
        assert_eq!((seen.present(), seen.done(), seen.changes()), (2, 2, 2));
        // Listed again after the watch broke: y was deleted meanwhile, x did not change.
        record(watcher::Event::Init);
        record(watcher::Event::InitApply(config_map("a", "x", "1")));
        assert_eq!(seen.present(), 2, "kept until the list ends");
        record(watcher::Event::InitDone);
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 1, 3));
        assert_eq!(seen.version("a/y"), None);
    }

    #[test]
    fn a_change_path_tells_the_operator_s_reaction_from_the_server_s_answers() {
        let sample = |total, sent: Option<f64>| ChangeSample {
            total,
            change_answer: 10.0,
            event_seen: Some(8.0),
            apply_sent: sent,
            apply_answer: sent.map(|s| s / 2.0),
        };
        let samples = [
            sample(30.0, Some(20.0)),
            sample(90.0, Some(60.0)),
            sample(50.0, None),
            sample(40.0, Some(24.0)),
        ];
        let path = ChangePath::of(&samples);
        assert_eq!(
            (
                path.apply_sent_p50,
                path.apply_sent_p99,
                path.apply_answer_p99
            ),
            (24.0, 60.0, 30.0)
        );
        assert_eq!((path.reaction_p50, path.reaction_p99), (16.0, 52.0));
        assert_eq!(path.event_seen_p99, 8.0);
        assert_eq!(path.applies_missing, 1);
        assert_eq!(path.slowest, vec![samples[1], samples[2], samples[3]]);
        assert_eq!(samples[2].to_string(), "50.0 = 10.0, 8.0, none, none ms");
    }

    #[tokio::test]
    async fn the_wait_ends_on_the_tick_that_makes_it_true() {
        let tick = Arc::new(watch::Sender::new(()));
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (set, ticker) = (flag.clone(), tick.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            set.store(true, std::sync::atomic::Ordering::SeqCst);
            ticker.send_replace(());
        });
        let start = Instant::now();
        let ready = || flag.load(std::sync::atomic::Ordering::SeqCst);
        assert!(wait_for(&tick, start + Duration::from_secs(30), ready).await);
        assert!(
            start.elapsed() < Duration::from_millis(900),
            "woken by the tick, not the 1 s timer"
        );
        let never = || false;
        assert!(!wait_for(&tick, Instant::now(), never).await);
    }
}
