//! The monitoring on a real Prometheus, on the node (issue 52). The operator is installed by
//! Helm; its ServiceMonitor, PodMonitor and PrometheusRule are rendered by the same chart with
//! the same values and turned into the scrape configuration the Prometheus Operator generates
//! (`cdn_operator_e2e::monitoring::scrape`), and a real Prometheus with a real Alertmanager
//! scrapes the operator (HTTPS, the token of a ServiceAccount the chart binds to its metrics
//! reader) and every CdnCluster pod's sidecar.
//!
//! Time runs [`SCALE`] times faster for Prometheus: the scrape and evaluation interval (the
//! shipped 30 s) and every duration of the rules (`for:`, ranges, offsets) are divided by it,
//! thresholds and expressions unchanged. What the product does in real time (nginx's timeouts,
//! the kubelet's probes, the operator's retries, the purge age in seconds) is not scaled.
//!
//! In one run: the targets up with the labels the rules and panels use; every metric of
//! `docs/metrics.txt` and `docs/cdn-metrics.txt` present; the hit ratio and origin offload read
//! from Prometheus against the origin's access log and the client over a burst through the
//! balancer's Service; a healthy run in which no alert is pending or firing; every panel of both
//! dashboards returning series; then each alert's cause, the alert firing within its `for:` plus
//! two scrape intervals of the moment its expression held, and its notification received by the
//! webhook behind Alertmanager. Skips with one line without a node or without the Prometheus and
//! Alertmanager binaries. Run by `e2e/node.sh`, or `cargo test -p cdn-operator-e2e --test
//! monitoring` against the cluster of `e2e/node.sh up`.

use cdn_operator::cdncluster::nginx::SERVICE_PORT_NAME;
use cdn_operator_e2e::monitoring::discovery::{self, Discovery};
use cdn_operator_e2e::monitoring::duration;
use cdn_operator_e2e::monitoring::prometheus::{self, Prometheus};
use cdn_operator_e2e::monitoring::{dashboards, rules, scrape};
use cdn_operator_e2e::node::{
    apply_cluster, apply_origin, cluster_running, local_volumes, operator_ready_and_leading,
    origin_log, ready_pods, service_account, service_address, token_valid_for, until, Backing,
    NodeTest, Scope, LEASE, ORIGIN_PODS,
};
use cdn_operator_e2e::{repository_root, say};
use cdn_operator_testkit::http::Response;
use cdn_operator_testkit::KeepAlive;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How many times faster Prometheus's time runs than the shipped configuration's.
const SCALE: u32 = 20;
/// The shipped scrape and evaluation interval (30 s), scaled.
const INTERVAL: Duration = Duration::from_millis(30_000 / SCALE as u64);
const WAIT: Duration = Duration::from_secs(300);
const HOST: &str = "cdn.monitoring-e2e.test";
/// The healthy run: no alert pending or firing through it. As long as the causes' phase takes
/// until its slowest alert (a purge open 300 s, then its `for:`).
const HEALTHY: Duration = Duration::from_secs(330);
/// The objects the steady load asks again and again through `edge` (small, from `/vod/`): so
/// many that a purge of them keeps `cache`'s hit ratio down for about a minute.
const HOT: u64 = 6000;
/// The steady load through `edge`, requests a second; every tenth asks a new object (the long
/// tail), so the hit ratio is about 90 %.
const EDGE_RATE: f64 = 100.0;
/// The burst whose hit ratio and offload are checked: at least 10,000 requests.
const BURST: u64 = 12_000;
/// The CDN's figures read from Prometheus agree with the origin's log and the client within this
/// (absolute: 0.01 is one percentage point).
const AGREEMENT: f64 = 0.01;

fn cache(extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "role": "cache",
        "replicas": 1,
        "cache": {"size": "256m"},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
        "sources": [{"name": "store", "origin": {"service": {"name": "origin", "port": 8080}}}],
    });
    merge(&mut spec, extra);
    spec
}

fn balancer(source: &str) -> serde_json::Value {
    json!({
        "role": "balancer",
        "replicas": 1,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
        "sources": [{"name": source}],
    })
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

// ---------------------------------------------------------------- the client

/// What a client counted.
#[derive(Clone, Debug, Default)]
struct Tally {
    requests: u64,
    /// Answers by status.
    statuses: BTreeMap<u16, u64>,
    /// Bytes of the 200 answers as they came on the wire (status line, headers, body).
    bytes_ok: u64,
    /// Requests not answered.
    errors: u64,
}

impl Tally {
    fn add(&mut self, answer: std::io::Result<Response>) {
        self.requests += 1;
        match answer {
            Ok(r) => {
                if r.status == 200 {
                    self.bytes_ok += wire_bytes(&r);
                }
                *self.statuses.entry(r.status).or_default() += 1;
            }
            Err(_) => self.errors += 1,
        }
    }

    fn ok(&self) -> u64 {
        self.statuses.get(&200).copied().unwrap_or(0)
    }
}

/// An nginx response's size on the wire: nginx writes `HTTP/1.1 200 OK`, then `Name: value`
/// lines, then an empty line (only 200 answers are sized).
fn wire_bytes(r: &Response) -> u64 {
    let head: usize = "HTTP/1.1 200 OK\r\n".len()
        + r.headers
            .iter()
            .map(|(n, v)| n.len() + 2 + v.len() + 2)
            .sum::<usize>()
        + 2;
    (head + r.body.len()) as u64
}

/// A client asking `path(n)` for n = 0, 1, 2… at a steady rate on one keep-alive connection,
/// until stopped; it can be paused.
struct Paced {
    tally: Arc<Mutex<Tally>>,
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Paced {
    fn start(
        addr: SocketAddr,
        per_second: f64,
        mut path: impl FnMut(u64) -> String + Send + 'static,
    ) -> Paced {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (tally, paused, stop) = (tally.clone(), paused.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c = KeepAlive::new(addr, HOST);
                let period = Duration::from_secs_f64(1.0 / per_second);
                let mut next = Instant::now();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    if paused.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                        next = Instant::now();
                        continue;
                    }
                    let answer = c.get(&path(n), &[]);
                    tally.lock().unwrap().add(answer);
                    n += 1;
                    next += period;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
            })
        };
        Paced {
            tally,
            paused,
            stop,
            thread: Some(thread),
        }
    }

    fn tally(&self) -> Tally {
        self.tally.lock().unwrap().clone()
    }

    /// Pauses once the request in flight is answered.
    async fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
        let before = self.tally().requests;
        tokio::time::sleep(Duration::from_millis(200)).await;
        // One request may have been in flight; it is answered within its timeout.
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.tally().requests != before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Asks each path once, in order, on one keep-alive connection.
async fn sweep(addr: SocketAddr, paths: Vec<String>) -> Tally {
    tokio::task::spawn_blocking(move || {
        let mut c = KeepAlive::new(addr, HOST);
        let mut tally = Tally::default();
        for path in &paths {
            tally.add(c.get(path, &[]));
        }
        tally
    })
    .await
    .unwrap()
}

/// The address of `pod`'s nginx (its container port named as the Services name it).
fn pod_address(pod: &Pod) -> SocketAddr {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_else(|| panic!("{} has no IP", pod.name_any()));
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(SERVICE_PORT_NAME))
        .unwrap_or_else(|| panic!("{} has no port {SERVICE_PORT_NAME}", pod.name_any()))
        .container_port;
    SocketAddr::new(ip.parse().expect("a pod IP"), port as u16)
}

// ---------------------------------------------------------------- the pods' processes

/// Sends `signal` to every process of container `container` of `pod`, found on this machine
/// (the node) by its container id in their cgroups: how many.
fn signal_container(pod: &Pod, container: &str, signal: i32) -> usize {
    let status = pod.status.as_ref().expect("a pod status");
    let id = status
        .container_statuses
        .iter()
        .chain(status.init_container_statuses.iter())
        .flatten()
        .find(|c| c.name == container)
        .and_then(|c| c.container_id.clone())
        .unwrap_or_else(|| panic!("container {container} of {} has no id", pod.name_any()));
    let id = id.rsplit("://").next().expect("an id").to_string();
    let mut signalled = 0;
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if cgroup.contains(&id) {
            // SAFETY: kill(2) on a pid read from /proc; no memory is shared.
            if unsafe { libc::kill(pid, signal) } == 0 {
                signalled += 1;
            }
        }
    }
    signalled
}

// ---------------------------------------------------------------- the alerts, as Prometheus lists them

/// What the watch saw of one alert (its name and labels).
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    labels: BTreeMap<String, String>,
    /// When its expression started to hold, as Prometheus says (`activeAt`).
    active_at: SystemTime,
    /// When the watch first saw it firing.
    firing_at: Option<SystemTime>,
    /// When the watch first saw it gone.
    gone_at: Option<SystemTime>,
}

/// Polls `/api/v1/alerts` every 250 ms on a thread of its own and keeps what it saw.
struct AlertWatch {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AlertWatch {
    fn start(p: Arc<Prometheus>) -> AlertWatch {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let now = SystemTime::now();
                    let alerts = p.alerts();
                    let mut seen = seen.lock().unwrap();
                    for a in &alerts {
                        let active_at = a
                            .active_at
                            .parse::<jiff::Timestamp>()
                            .map(SystemTime::from)
                            .unwrap_or(now);
                        let current = seen.iter_mut().find(|s| {
                            s.name == a.name && s.labels == a.labels && s.gone_at.is_none()
                        });
                        let entry = match current {
                            Some(s) => s,
                            None => {
                                seen.push(Seen {
                                    name: a.name.clone(),
                                    labels: a.labels.clone(),
                                    active_at,
                                    firing_at: None,
                                    gone_at: None,
                                });
                                seen.last_mut().unwrap()
                            }
                        };
                        if a.state == "firing" && entry.firing_at.is_none() {
                            entry.firing_at = Some(now);
                        }
                    }
                    for s in seen.iter_mut().filter(|s| s.gone_at.is_none()) {
                        if !alerts
                            .iter()
                            .any(|a| a.name == s.name && a.labels == s.labels)
                        {
                            s.gone_at = Some(now);
                        }
                    }
                    drop(seen);
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
        };
        AlertWatch {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// What it saw since `since` (pending or firing then or after).
    fn seen_since(&self, since: SystemTime) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.gone_at.is_none_or(|g| g >= since))
            .collect()
    }
}

impl Drop for AlertWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An alert the test causes: its name, the labels that say which object it is about, and when
/// the cause was made.
struct Expected {
    name: &'static str,
    labels: Vec<(&'static str, String)>,
    cause: &'static str,
    caused_at: SystemTime,
}

impl Expected {
    fn matches(&self, s: &Seen) -> bool {
        s.name == self.name && self.labels.iter().all(|(k, v)| s.labels.get(*k) == Some(v))
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn since(earlier: SystemTime, later: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// Waits until every expected alert has been seen firing (each within its rule's `for:` and
/// [`WAIT`] more), then checks the time from its expression holding to firing: at most `for:`
/// plus two scrape intervals. One line per alert.
async fn fired(watch: &AlertWatch, expected: &[Expected], rules: &[rules::Alert]) {
    for e in expected {
        let rule = rules
            .iter()
            .find(|r| r.name == e.name)
            .unwrap_or_else(|| panic!("no rule {}", e.name));
        let seen = until(
            &format!("{} {:?} firing ({})", e.name, e.labels, e.cause),
            rule.for_ + WAIT,
            || async {
                watch
                    .seen()
                    .into_iter()
                    .find(|s| e.matches(s) && s.firing_at.is_some() && s.active_at >= e.caused_at)
                    .ok_or_else(|| {
                        let now: Vec<String> = watch
                            .seen_since(e.caused_at)
                            .iter()
                            .map(|s| {
                                format!(
                                    "{} {:?} firing {}",
                                    s.name,
                                    s.labels,
                                    s.firing_at.is_some()
                                )
                            })
                            .collect();
                        format!("seen since the cause: {now:?}")
                    })
            },
        )
        .await;
        let firing_at = seen.firing_at.expect("firing");
        let held = since(e.caused_at, seen.active_at);
        let to_fire = since(seen.active_at, firing_at);
        let budget = rule.for_ + 2 * INTERVAL;
        say(&format!(
            "monitoring: {} ({}): expression held {} after the cause, firing {} later (for: {}, budget {}), {} after the cause",
            e.name,
            e.cause,
            secs(held),
            secs(to_fire),
            secs(rule.for_),
            secs(budget),
            secs(since(e.caused_at, firing_at)),
        ));
        assert!(
            to_fire <= budget,
            "{} fired {} after its expression held, over for: {} + 2 scrape intervals",
            e.name,
            secs(to_fire),
            secs(rule.for_)
        );
    }
}

// ---------------------------------------------------------------- Prometheus's view of the CDN

/// The sum of a counter's series, as Prometheus has it now.
fn total(p: &Prometheus, selector: &str) -> f64 {
    p.query(&format!("sum({selector})"))
        .unwrap_or_else(|e| panic!("{e}"))
        .first()
        .map(|s| s.value)
        .unwrap_or(0.0)
}

/// The counters of `edge` and `cache` the dashboard's hit ratio and offload read.
#[derive(Clone, Copy, Debug)]
struct CdnCounters {
    balancer_requests: f64,
    balancer_sent: f64,
    cache_hits: f64,
    cache_counted: f64,
    cache_from_origin: f64,
}

fn cdn_counters(p: &Prometheus, ns: &str) -> CdnCounters {
    let sel = |cluster: &str, more: &str| {
        format!("{{namespace=\"{ns}\", cdncluster=\"{cluster}\"{more}}}")
    };
    CdnCounters {
        balancer_requests: total(
            p,
            &format!("cdn_requests_total{}", sel("edge", ", role=\"balancer\"")),
        ),
        balancer_sent: total(
            p,
            &format!("cdn_sent_bytes_total{}", sel("edge", ", role=\"balancer\"")),
        ),
        cache_hits: total(
            p,
            &format!(
                "cdn_requests_total{}",
                sel(
                    "cache",
                    ", role=\"cache\", cache_status=~\"HIT|STALE|UPDATING|REVALIDATED\""
                )
            ),
        ),
        cache_counted: total(
            p,
            &format!(
                "cdn_requests_total{}",
                sel("cache", ", role=\"cache\", cache_status!=\"NONE\"")
            ),
        ),
        cache_from_origin: total(
            p,
            &format!(
                "cdn_upstream_received_bytes_total{}",
                sel("cache", ", role=\"cache\", source_kind=\"origin\"")
            ),
        ),
    }
}

// ---------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_scrapes_every_target_every_alert_fires_on_its_cause_every_panel_has_data() {
    let binaries = match prometheus::binaries() {
        Ok(b) => b,
        Err(why) => {
            say(&format!("node tests skipped: monitoring: {why}"));
            return;
        }
    };
    let Some(mut t) = NodeTest::new("monitoring", Scope::Cluster).await else {
        return;
    };
    let client = t.client.clone();
    let op_ns = t.namespace("mon-op").await;
    let ns = t.namespace("mon-cdn").await;
    let bad = t.namespace("mon-bad").await;

    // The operator as a user installs it with Prometheus: the chart binds its metrics reader to
    // Prometheus's ServiceAccount.
    service_account(&client, &op_ns, "prometheus").await;
    let values = vec![
        "--set-string=metrics.reader.serviceAccount.name=prometheus".to_string(),
        format!("--set-string=metrics.reader.serviceAccount.namespace={op_ns}"),
    ];
    let release = t.helm_install(&op_ns, "mon", &values).await;
    let (_, leader) = operator_ready_and_leading(&client, &op_ns).await;
    say(&format!(
        "monitoring: the operator installed, {leader} leads"
    ));

    // The CDN: `edge` ← `cache` ← origin carries the steady load; `edge-lost` ← `cache-lost`
    // (a tier that will hang); `cache-err` (asked paths the origin fails), `cache-full` (its
    // volume a 48 MiB filesystem under a 1 GiB max_size) and `cache-churn` (64 MiB: at least
    // 40 s of the intake it is given, see CdnCacheEvictingFast's runbook) are asked
    // directly. A successful At and a completed purge, as any CDN has.
    let small_fs = t.unique("mon-small");
    local_volumes(&mut t, &small_fs, 1, "2Gi", Backing::Tmpfs(48)).await;
    apply_origin(&client, &ns, &t.nginx_image).await;
    let origin = ready_pods(&client, &ns, ORIGIN_PODS, 1, WAIT).await[0].name_any();
    apply_cluster(&client, &ns, "cache", cache(json!({}))).await;
    apply_cluster(&client, &ns, "edge", balancer("cache")).await;
    apply_cluster(&client, &ns, "cache-lost", cache(json!({}))).await;
    apply_cluster(&client, &ns, "edge-lost", balancer("cache-lost")).await;
    apply_cluster(&client, &ns, "cache-err", cache(json!({}))).await;
    apply_cluster(
        &client,
        &ns,
        "cache-full",
        cache(json!({"cache": {"size": "1g", "volume": {"storageClassName": small_fs}}})),
    )
    .await;
    apply_cluster(
        &client,
        &ns,
        "cache-churn",
        cache(json!({"cache": {"size": "64m"}})),
    )
    .await;
    let clusters = [
        "cache",
        "edge",
        "cache-lost",
        "edge-lost",
        "cache-err",
        "cache-full",
        "cache-churn",
    ];
    let mut pods = BTreeMap::new();
    for c in clusters {
        pods.insert(c, cluster_running(&client, &ns, c, WAIT).await);
    }
    apply(&client, &ns, at("hello", "echo hello")).await;
    apply(
        &client,
        &ns,
        purge(
            "tidy",
            json!({"cdnCluster": "edge", "paths": ["/vod/none"]}),
        ),
    )
    .await;
    // Balancers through their Service; a cache (headless: its balancers resolve its pods) at
    // its one pod.
    let addr = |name: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move { service_address(&client, &ns, name, SERVICE_PORT_NAME).await }
    };
    let (edge, edge_lost) = (addr("edge").await, addr("edge-lost").await);
    let (cache_err, cache_full, cache_churn) = (
        pod_address(&pods["cache-err"][0]),
        pod_address(&pods["cache-full"][0]),
        pod_address(&pods["cache-churn"][0]),
    );

    // Prometheus as the Prometheus Operator would configure it for the chart's monitors.
    let more = [
        "--set=metrics.serviceMonitor.enabled=true".to_string(),
        "--set=cdnMetrics.podMonitor.enabled=true".to_string(),
        "--set=prometheusRule.enabled=true".to_string(),
    ];
    let render = t.helm_template(&release, &values, &more);
    let token = token_valid_for(&client, &op_ns, "prometheus", Duration::from_secs(3 * 3600)).await;
    let (prometheus, _discovery) = start_prometheus(&t, &binaries, &render, &token).await;
    let p = Arc::new(prometheus);
    let alert_rules = rules::alerts(&scaled_rules(&render)).unwrap_or_else(|e| panic!("{e}"));

    // 1. The targets: both operator replicas over HTTPS and every CdnCluster pod's sidecar, up,
    //    with the labels the rules and panels use.
    let sidecars: Vec<String> = pods.values().flatten().map(|p| p.name_any()).collect();
    let targets = until("every target up", Duration::from_secs(90), || {
        let p = p.clone();
        let sidecars = sidecars.clone();
        let op_ns = op_ns.clone();
        async move {
            let targets = p.targets();
            let operator: Vec<_> = targets
                .iter()
                .filter(|t| t.labels.get("job").map(String::as_str) == Some("cdn-operator"))
                .collect();
            let cdn: Vec<_> = targets
                .iter()
                .filter(|t| t.labels.get("job").map(String::as_str) == Some("cdncluster"))
                .collect();
            let down: Vec<String> = targets
                .iter()
                .filter(|t| t.health != "up")
                .map(|t| {
                    format!(
                        "{} {}: {} {}",
                        t.scrape_pool, t.scrape_url, t.health, t.last_error
                    )
                })
                .collect();
            let missing: Vec<&String> = sidecars
                .iter()
                .filter(|s| !cdn.iter().any(|t| t.labels.get("pod") == Some(s)))
                .collect();
            if operator.len() == 2
                && operator
                    .iter()
                    .all(|t| t.labels.get("namespace") == Some(&op_ns))
                && missing.is_empty()
                && down.is_empty()
            {
                Ok(targets)
            } else {
                Err(format!(
                    "{} operator targets, sidecars missing {missing:?}, down {down:?}",
                    operator.len()
                ))
            }
        }
    })
    .await;
    for target in &targets {
        say(&format!(
            "monitoring: target up: {} {} {:?}",
            target.scrape_pool, target.scrape_url, target.labels
        ));
        for label in ["namespace", "pod", "job", "endpoint", "container"] {
            assert!(target.labels.contains_key(label), "{label} on {target:?}");
        }
        if target.labels["job"] == "cdn-operator" {
            assert!(target.scrape_url.starts_with("https://"), "{target:?}");
            assert_eq!(
                target.labels["service"],
                format!("{}-metrics", release.fullname)
            );
        }
    }

    // The steady load: the hot objects cached once, then asked again and again with a long
    // tail; a light load on the other clusters.
    let warm = sweep(edge, (0..HOT).map(|i| format!("/vod/h/{i}")).collect()).await;
    assert_eq!(warm.ok(), HOT, "the hot objects through edge: {warm:?}");
    let edge_load = Paced::start(edge, EDGE_RATE, |n| {
        if n % 10 == 9 {
            format!("/vod/t/{n}")
        } else {
            format!("/vod/h/{}", (n * 7) % HOT)
        }
    });
    let lost_load = Paced::start(edge_lost, 20.0, |n| format!("/vod/l/{}", n % 100));
    let err_load = Paced::start(cache_err, 5.0, |n| format!("/vod/e/{}", n % 100));
    let full_load = Paced::start(cache_full, 2.0, |n| format!("/vod/f/{}", n % 100));
    let churn_load = Paced::start(cache_churn, 1.0, |n| format!("/vod/c/{n}"));

    // 2. Agreement: a burst through the balancer's Service, the steady load paused; its hit
    //    ratio and offload from the sidecars' series against the origin's log and the client.
    edge_load.pause().await;
    tokio::time::sleep(4 * INTERVAL + Duration::from_secs(2)).await;
    let before = cdn_counters(&p, &ns);
    let origin_before = origin_log(&client, &ns, &origin).await.len();
    let burst_paths: Vec<String> = (0..BURST)
        .map(|n| {
            if n % 10 == 9 {
                format!("/vod/b/t{n}")
            } else {
                format!("/vod/b/h{}", (n * 7) % 600)
            }
        })
        .collect();
    let burst = sweep(edge, burst_paths).await;
    assert_eq!(burst.ok(), BURST, "the burst: {burst:?}");
    // nginx writes its metrics log every second; two scrapes later Prometheus has it all.
    until(
        "the burst counted by Prometheus",
        Duration::from_secs(30),
        || {
            let now = cdn_counters(&p, &ns);
            std::future::ready(
                if now.balancer_requests - before.balancer_requests >= BURST as f64 {
                    Ok(())
                } else {
                    Err(format!("{now:?}"))
                },
            )
        },
    )
    .await;
    // And the caches' lines, written a moment after the balancer's.
    tokio::time::sleep(3 * INTERVAL).await;
    let after = cdn_counters(&p, &ns);
    let fetched: Vec<_> = origin_log(&client, &ns, &origin)
        .await
        .split_off(origin_before);
    let fetched: Vec<_> = fetched
        .into_iter()
        .filter(|r| r.path.starts_with("/vod/b/"))
        .collect();
    edge_load.resume();
    let origin_bytes: u64 = fetched.iter().map(|r| r.bytes).sum();
    let truth_hit = 1.0 - fetched.len() as f64 / burst.requests as f64;
    let truth_offload = 1.0 - origin_bytes as f64 / burst.bytes_ok as f64;
    let prom_hit =
        (after.cache_hits - before.cache_hits) / (after.cache_counted - before.cache_counted);
    let prom_offload = 1.0
        - (after.cache_from_origin - before.cache_from_origin)
            / (after.balancer_sent - before.balancer_sent);
    say(&format!(
        "monitoring: agreement over {} requests through edge: hit ratio {:.4} from Prometheus, {:.4} from the origin's log ({} fetches); offload {:.4} from Prometheus, {:.4} from the origin's log and the client ({} of {} bytes); balancer requests {} (client {}), bytes sent {} (client {})",
        burst.requests,
        prom_hit,
        truth_hit,
        fetched.len(),
        prom_offload,
        truth_offload,
        origin_bytes,
        burst.bytes_ok,
        after.balancer_requests - before.balancer_requests,
        burst.requests,
        after.balancer_sent - before.balancer_sent,
        burst.bytes_ok,
    ));
    assert!(
        (prom_hit - truth_hit).abs() <= AGREEMENT,
        "hit ratio {prom_hit} vs {truth_hit}"
    );
    assert!(
        (prom_offload - truth_offload).abs() <= AGREEMENT,
        "offload {prom_offload} vs {truth_offload}"
    );

    // Every metric both docs list, with the labels the rules and panels join on (the traffic's
    // once there was traffic).
    let repo = repository_root();
    for (doc, labels) in [
        ("docs/metrics.txt", &["namespace", "pod"][..]),
        (
            "docs/cdn-metrics.txt",
            &["namespace", "pod", "cdncluster", "role"][..],
        ),
    ] {
        let names = std::fs::read_to_string(repo.join(doc)).expect(doc);
        for name in names
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let series = p.query(&format!("{{__name__=\"{name}\"}}")).unwrap();
            assert!(
                !series.is_empty(),
                "{name} ({doc}): no series in Prometheus"
            );
            for s in &series {
                for label in labels {
                    assert!(
                        s.labels.contains_key(*label),
                        "{name} without {label}: {:?}",
                        s.labels
                    );
                }
            }
            say(&format!("monitoring: {name}: {} series", series.len()));
        }
    }

    // 3. The healthy run: no alert pending or firing.
    let watch = AlertWatch::start(p.clone());
    let healthy_from = SystemTime::now();
    tokio::time::sleep(HEALTHY).await;
    let seen = watch.seen_since(healthy_from);
    assert!(
        seen.is_empty(),
        "alerts pending or firing in the healthy run: {:#?}",
        seen.iter()
            .map(|s| (&s.name, &s.labels, s.firing_at.is_some()))
            .collect::<Vec<_>>()
    );
    say(&format!(
        "monitoring: healthy run of {}: no alert pending or firing ({} rules)",
        secs(HEALTHY),
        alert_rules.len()
    ));

    // 4. Every panel of both dashboards returns series, its variables resolved as Grafana does
    //    (every value: "All").
    panels_have_data(&p, &repo);

    // 5. The causes, all at once; each alert fires on its own.
    let mut expected = Vec::new();
    let now = SystemTime::now;
    // An origin answering 503 to what a cache asks: one request a second beside the five the
    // cache serves (so its hit ratio stays above half of what it was).
    let fail_load = Paced::start(cache_err, 1.0, |n| format!("/fail/{n}"));
    expected.push(Expected {
        name: "CdnOriginErrors",
        labels: vec![
            ("namespace", ns.clone()),
            ("cdncluster", "cache-err".into()),
        ],
        cause: "the origin answers 503",
        caused_at: now(),
    });
    // A cache tier that hangs: every nginx process of cache-lost's pod stopped.
    let lost = &pods["cache-lost"];
    let stopped_at = now();
    assert!(
        signal_container(&lost[0], "nginx", libc::SIGSTOP) > 0,
        "nginx of cache-lost"
    );
    expected.push(Expected {
        name: "CdnNginxDown",
        labels: vec![("namespace", ns.clone()), ("pod", lost[0].name_any())],
        cause: "nginx of a cache pod stopped (SIGSTOP)",
        caused_at: stopped_at,
    });
    expected.push(Expected {
        name: "CdnCacheTierUnreachable",
        labels: vec![
            ("namespace", ns.clone()),
            ("cdncluster", "edge-lost".into()),
        ],
        cause: "the balancer's cache tier hangs",
        caused_at: stopped_at,
    });
    // The hot objects purged: cache's hit ratio collapses while they are fetched again.
    apply(
        &client,
        &ns,
        purge(
            "hot",
            json!({"cdnCluster": "edge", "prefixes": ["/vod/h/"]}),
        ),
    )
    .await;
    expected.push(Expected {
        name: "CdnHitRatioCollapse",
        labels: vec![("namespace", ns.clone()), ("cdncluster", "cache".into())],
        cause: "the hot objects purged",
        caused_at: now(),
    });
    // A cache filling a filesystem smaller than its max_size: 1,000 new objects of 60 KiB, each
    // between two hits (so its hit ratio stays above half of what it was).
    drop(full_load);
    let fill = Paced::start(cache_full, 45.0, |n| {
        if n % 3 == 0 && n / 3 < 1000 {
            format!("/big/f/{}", n / 3)
        } else {
            format!("/vod/f/{}", n % 100)
        }
    });
    expected.push(Expected {
        name: "CdnCacheFilesystemFull",
        labels: vec![
            ("namespace", ns.clone()),
            ("cdncluster", "cache-full".into()),
        ],
        cause: "60 MB asked of a cache on a 48 MiB filesystem",
        caused_at: now(),
    });
    // A cache taking in much more than its size, much faster than before.
    let churn_burst = Paced::start(cache_churn, 20.0, |n| format!("/big/c/{n}"));
    expected.push(Expected {
        name: "CdnCacheEvictingFast",
        labels: vec![
            ("namespace", ns.clone()),
            ("cdncluster", "cache-churn".into()),
        ],
        cause: "a 64 MiB cache asked 1.2 MB/s of new objects",
        caused_at: now(),
    });
    // The operator's objects that cannot get on: a missing source, pods that cannot all run
    // (a volume for one of two), a purge waiting for the other, an At whose command fails.
    let one_volume = t.unique("mon-one");
    local_volumes(&mut t, &one_volume, 1, "2Gi", Backing::Disk).await;
    apply_cluster(
        &client,
        &bad,
        "waiting",
        cache(json!({"sources": [{"name": "nowhere"}]})),
    )
    .await;
    expected.push(Expected {
        name: "CdnClusterWaitingSource",
        labels: vec![("namespace", bad.clone())],
        cause: "a CdnCluster whose source does not exist",
        caused_at: now(),
    });
    apply_cluster(
        &client,
        &bad,
        "stuck",
        cache(json!({"replicas": 2, "cache": {"volume": {"storageClassName": one_volume}}})),
    )
    .await;
    expected.push(Expected {
        name: "CdnClusterDeployingTooLong",
        labels: vec![("namespace", bad.clone())],
        cause: "a CdnCluster with a volume for one of its two pods",
        caused_at: now(),
    });
    apply(
        &client,
        &bad,
        purge("waits", json!({"cdnCluster": "stuck", "all": true})),
    )
    .await;
    expected.push(Expected {
        name: "CdnPurgeIncomplete",
        labels: vec![("namespace", bad.clone())],
        cause: "a purge waiting for a pod that cannot run",
        caused_at: now(),
    });
    apply(&client, &bad, at("fails", "exit 3")).await;
    expected.push(Expected {
        name: "AtFailed",
        labels: vec![("namespace", bad.clone())],
        cause: "an At whose command exits 3",
        caused_at: now(),
    });
    let causes_from = expected.iter().map(|e| e.caused_at).min().unwrap();
    fired(&watch, &expected, &alert_rules).await;
    say(&format!(
        "monitoring: cache-full asked new objects of 60 KiB between hits: {:?}",
        fill.tally().statuses
    ));
    drop((fail_load, churn_burst, fill));

    // 6. The operator without a leader (its Lease held by a holder that is none of its pods),
    //    then without any replica.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &op_ns);
    // Serialized as the API server's MicroTime (microseconds), which it parses strictly.
    let now_micro = serde_json::to_value(MicroTime(jiff::Timestamp::now())).unwrap();
    let ghost = json!({"spec": {
        "holderIdentity": "a-replica-that-is-gone",
        "leaseDurationSeconds": 3600,
        "renewTime": now_micro,
        "acquireTime": now_micro,
    }});
    leases
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(&ghost))
        .await
        .expect("the Lease taken");
    let no_leader = [Expected {
        name: "CdnOperatorNoLeader",
        labels: vec![("namespace", op_ns.clone())],
        cause: "the Lease held by a holder that is none of the replicas",
        caused_at: now(),
    }];
    fired(&watch, &no_leader, &alert_rules).await;
    leases
        .delete(LEASE, &DeleteParams::default())
        .await
        .expect("the Lease deleted");
    operator_ready_and_leading(&client, &op_ns).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &op_ns);
    let scale = |n: i32| json!({"spec": {"replicas": n}});
    deployments
        .patch(
            &release.fullname,
            &PatchParams::default(),
            &Patch::Merge(&scale(0)),
        )
        .await
        .expect("the operator scaled to 0");
    let down = [Expected {
        name: "CdnOperatorDown",
        labels: vec![],
        cause: "the operator's Deployment scaled to 0",
        caused_at: now(),
    }];
    fired(&watch, &down, &alert_rules).await;
    deployments
        .patch(
            &release.fullname,
            &PatchParams::default(),
            &Patch::Merge(&scale(2)),
        )
        .await
        .expect("the operator scaled back");
    operator_ready_and_leading(&client, &op_ns).await;

    // Only the causes': no other alert fired after them.
    let all: Vec<&Expected> = expected.iter().chain(&no_leader).chain(&down).collect();
    let others: Vec<String> = watch
        .seen_since(causes_from)
        .iter()
        .filter(|s| s.firing_at.is_some() && !all.iter().any(|e| e.matches(s)))
        .map(|s| format!("{} {:?}", s.name, s.labels))
        .collect();
    assert!(
        others.is_empty(),
        "alerts firing that no cause explains: {others:#?}"
    );
    // Every alert of the rules was caused, but the one that follows the operator's retries,
    // which are not time-scaled: tests/alerts/ shows it on their real times. A new rule without
    // a cause here fails.
    let caused: BTreeSet<&str> = all.iter().map(|e| e.name).collect();
    let untested: Vec<&str> = alert_rules
        .iter()
        .map(|r| r.name.as_str())
        .filter(|n| !caused.contains(n))
        .collect();
    assert_eq!(
        untested,
        ["CdnOperatorReconcileErrors"],
        "alerts without a cause"
    );
    // Alertmanager notified the webhook of every one.
    let notified = until(
        "every alert at the webhook",
        Duration::from_secs(30),
        || {
            let received = p.webhook.received();
            let missing: Vec<&str> = caused
                .iter()
                .copied()
                .filter(|n| {
                    !received
                        .iter()
                        .any(|r| r.alertname == *n && r.status == "firing")
                })
                .collect();
            std::future::ready(if missing.is_empty() {
                Ok(received)
            } else {
                Err(format!("not notified: {missing:?}"))
            })
        },
    )
    .await;
    say(&format!(
        "monitoring: the webhook received {} notifications of {} alerts ({} resolved)",
        notified.len(),
        caused.len(),
        notified.iter().filter(|n| n.status == "resolved").count()
    ));
    drop((edge_load, lost_load, err_load, churn_load));
}

/// The manifests of an At and a CdnPurge, as a user writes them.
fn at(name: &str, command: &str) -> serde_json::Value {
    json!({
        "apiVersion": "cnat.programming-kubernetes.info/v1alpha1", "kind": "At",
        "metadata": {"name": name},
        "spec": {"schedule": "2020-01-01T00:00:00Z", "command": command},
    })
}

fn purge(name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "cluster.anevia.com/v1", "kind": "CdnPurge",
        "metadata": {"name": name}, "spec": spec,
    })
}

/// Creates `object` in `ns`.
async fn apply(client: &Client, ns: &str, object: serde_json::Value) {
    let (group, version) = object["apiVersion"]
        .as_str()
        .unwrap()
        .split_once('/')
        .unwrap();
    let kind = object["kind"].as_str().unwrap().to_string();
    let gvk = kube::core::GroupVersionKind::gvk(group, version, &kind);
    let plural = format!("{}s", kind.to_lowercase());
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    let name = object.name_any();
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("{kind} {ns}/{name}: {e}"));
}

/// The chart's PrometheusRule, its durations scaled.
fn scaled_rules(render: &str) -> serde_json::Value {
    let groups = rules::prometheus_rule_groups(render).unwrap_or_else(|e| panic!("{e}"));
    rules::scale_rules(&groups, SCALE).unwrap_or_else(|e| panic!("{e}"))
}

/// Prometheus and Alertmanager with the scrape configuration of the chart's monitors and its
/// rules, time-scaled, and the discovery that gives Prometheus its Kubernetes targets (Debian's
/// has no Kubernetes discovery of its own).
async fn start_prometheus(
    t: &NodeTest,
    binaries: &(std::path::PathBuf, std::path::PathBuf),
    render: &str,
    token: &str,
) -> (Prometheus, Discovery) {
    let dir = t.dir.path();
    let token_file = dir.join("prometheus-token");
    std::fs::write(&token_file, token).unwrap();
    let kubeconfig = kubeconfig_path();
    let (assets, sd) = (dir.join("assets"), dir.join("sd"));
    for d in [&assets, &sd] {
        std::fs::create_dir_all(d).unwrap();
    }
    let documents = scrape::yaml_documents(render).unwrap_or_else(|e| panic!("{e}"));
    // The chart's monitors name no Secret or ConfigMap (the token is Prometheus's own).
    let resolve = |ns: &str, kind: &str, name: &str, key: &str| -> Result<String, String> {
        Err(format!(
            "{kind} {ns}/{name} key {key}: not expected in the chart's monitors"
        ))
    };
    let env = scrape::Environment {
        kubeconfig: &kubeconfig,
        token_file: &token_file,
        resolve: &resolve,
        assets_dir: &assets,
        time_scale: SCALE,
    };
    let mut configs = scrape::scrape_configs(&documents, &env).unwrap_or_else(|e| panic!("{e}"));
    let jobs = discovery::file_sd(&mut configs, &sd).unwrap_or_else(|e| panic!("{e}"));
    let discovery = Discovery::start(t.client.clone(), jobs, Duration::from_secs(1))
        .await
        .unwrap_or_else(|e| panic!("discovery: {e}"));
    let rules = scaled_rules(render);
    let binaries = binaries.clone();
    let interval = duration::format(INTERVAL);
    let prometheus = tokio::task::spawn_blocking(move || {
        Prometheus::start(&binaries, &configs, &rules, &interval)
    })
    .await
    .unwrap();
    (prometheus, discovery)
}

/// The kubeconfig the tests use: Prometheus discovers the targets with it.
fn kubeconfig_path() -> std::path::PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".kube/config"))
        })
        .expect("KUBECONFIG or HOME")
}

/// Every query of both dashboards returns at least one series (how many hold a number, not NaN,
/// is printed), its variables resolved as Grafana resolves them (`label_values` through
/// `/api/v1/series`, each set to "All" where it may be, else to its first value): one line per
/// query.
fn panels_have_data(p: &Prometheus, repo: &std::path::Path) {
    use dashboards::{Intervals, Selection, Variables};
    let intervals = Intervals {
        scrape: INTERVAL,
        interval: INTERVAL,
        range: Duration::from_secs(3600 / SCALE as u64),
    };
    let mut empty = Vec::new();
    for file in ["cdn-clusters.json", "cdn-operator.json"] {
        let path = repo
            .join("kustomize/components/grafana-dashboards")
            .join(file);
        let json =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut variables = Variables::new(intervals);
        for v in dashboards::variable_queries(&json).unwrap_or_else(|e| panic!("{e}")) {
            let query = variables
                .substitute(&v.query)
                .unwrap_or_else(|e| panic!("{e}"));
            let (selector, label) = dashboards::parse_label_values(&query)
                .unwrap_or_else(|| panic!("{file}: variable {}: {query}", v.name));
            let values = p
                .label_values(&selector, &label)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                !values.is_empty(),
                "{file}: variable {} has no value ({query})",
                v.name
            );
            say(&format!(
                "monitoring: {file}: variable {} = {values:?}",
                v.name
            ));
            let selection = if v.include_all {
                Selection::All(values)
            } else {
                Selection::Values(vec![values[0].clone()])
            };
            variables
                .select(&v, selection)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        for q in dashboards::panel_queries(&json, &variables).unwrap_or_else(|e| panic!("{e}")) {
            let what = format!(
                "{file}: {} / {} ({})",
                q.row.as_deref().unwrap_or("-"),
                q.panel,
                q.ref_id
            );
            if q.hidden {
                say(&format!("monitoring: {what}: hidden, not asked"));
                continue;
            }
            let series = p.query(&q.expr).unwrap_or_else(|e| panic!("{what}: {e}"));
            let numbers = series.iter().filter(|s| s.value.is_finite()).count();
            say(&format!(
                "monitoring: panel {what}: {} series, {numbers} with a number",
                series.len()
            ));
            // A ratio of rates with nothing to divide (a histogram of reconciles while none
            // ran) is a series whose value is NaN: Grafana draws nothing for that moment, but
            // the query works.
            if series.is_empty() {
                empty.push(format!("{what}: {}", q.expr));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data in the healthy run: {empty:#?}"
    );
}
