//! Applying purges to pods: each purge is a job that walks its tiers (the cache clusters it
//! reaches, [`super::targets`]), each tier's pods applying it; each pod has one queue, whose
//! purges go out together, in one signed batch, one walk of its cache. So a burst of purges costs
//! each pod a few walks, not one per purge.
//!
//! The order of the tiers: a cache cluster with cache clusters below it is purged at once (its
//! viewers stop getting what was purged) and again once every cluster below it has applied the
//! purge, as it may have fetched a purged object again from one of them meanwhile. A pod that
//! does not answer is retried, backing off, for as long as it exists: a purge is complete once
//! every pod has applied it, or is gone. A pod of a cache with a volume is not gone with its pod:
//! its volume comes back with the pod of the same name, which the purge waits for.

use super::pods::{PodTargets, Target};
use super::signing::Signer;
use super::targets::Tier;
use crate::nginx_cache::wire::{self, Applied, Batch};
use futures::stream::{FuturesUnordered, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a pod has to answer a batch: its walk waits up to 30 s for the fills in flight.
const SEND_TIMEOUT: Duration = Duration::from_secs(90);
/// The waits between a pod's failed tries: doubled from the first to the last.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(15);

/// A purge, by its object (a re-created purge of the same name is another job).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a job is to apply.
#[derive(Clone, Debug)]
pub struct Job {
    pub key: JobKey,
    /// The purge, as batches carry it (its `id` is set by pass).
    pub purge: wire::Purge,
    pub tiers: Vec<Tier>,
}

/// A pod a job waits for, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub pod: String,
    pub cluster: String,
    pub why: String,
}

/// Where a job stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub started: Timestamp,
    /// When the last pod applied it.
    pub finished: Option<Timestamp>,
    /// Pods that must apply it (its last pass on each tier), as far as its passes have begun.
    pub pods: u32,
    /// Those that did.
    pub pods_done: u32,
    /// Objects invalidated, over every pod and pass.
    pub objects: u64,
    /// The pods that did not answer their last try, by name.
    pub waiting: BTreeMap<String, Waiting>,
    /// Why it cannot be applied at all.
    pub failed: Option<String>,
    /// When its status was last written by this process.
    pub status_written: Option<Instant>,
}

impl Progress {
    fn new() -> Self {
        Progress {
            started: Timestamp::now(),
            finished: None,
            pods: 0,
            pods_done: 0,
            objects: 0,
            waiting: BTreeMap::new(),
            failed: None,
            status_written: None,
        }
    }

    /// Whether nothing more happens to it.
    pub fn is_over(&self) -> bool {
        self.finished.is_some() || self.failed.is_some()
    }
}

/// Told when a job's progress calls for a status: it finished, failed, or a pod stopped
/// answering.
pub type Notify = Arc<dyn Fn(&JobKey) + Send + Sync>;

/// The jobs and the pods' queues. Cheap to clone: every clone is the same.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

struct Inner {
    signer: Arc<Signer>,
    http: HttpClient<hyper_util::client::legacy::connect::HttpConnector, Full<bytes::Bytes>>,
    jobs: Mutex<HashMap<JobKey, Progress>>,
    queues: Mutex<HashMap<String, Vec<Item>>>,
    pods: PodTargets,
    kept: Kept,
    notify: Notify,
}

/// A purge waiting in a pod's queue.
struct Item {
    job: JobKey,
    purge: wire::Purge,
    cluster: String,
    pod: Target,
    /// The pod keeps its cache on a volume that outlives it ([`Tier::kept`]).
    kept: bool,
    done: oneshot::Sender<Ack>,
}

/// Whether the pod named so (the third) of a cluster (the second) of a namespace (the first)
/// still has its volume: its cluster has a volume and that many replicas. A claim of a pod the
/// cluster no longer asks for is deleted with it.
pub type Kept = Arc<dyn Fn(&str, &str, &str) -> bool + Send + Sync>;

/// How often a purge looks for the pod that a pod with a volume is replaced by.
const REPLACED_EVERY: Duration = Duration::from_secs(1);

/// What became of a purge on a pod.
enum Ack {
    Applied(u64),
    /// The pod is gone (or no longer running): nothing left to purge there.
    Gone,
}

impl Dispatcher {
    pub fn new(signer: Arc<Signer>, pods: PodTargets, kept: Kept, notify: Notify) -> Self {
        let http = HttpClient::builder(TokioExecutor::new()).build_http();
        Dispatcher {
            inner: Arc::new(Inner {
                signer,
                http,
                jobs: Mutex::default(),
                queues: Mutex::default(),
                pods,
                kept,
                notify,
            }),
        }
    }

    /// Where the job of `key` stands, if it is known.
    pub fn progress(&self, key: &JobKey) -> Option<Progress> {
        self.inner.jobs().get(key).cloned()
    }

    /// Starts `job` unless it is known already.
    pub fn start(&self, job: Job) {
        {
            let mut jobs = self.inner.jobs();
            if jobs.contains_key(&job.key) {
                return;
            }
            jobs.insert(job.key.clone(), Progress::new());
        }
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.run(job).await });
    }

    /// Notes that the status of `key` was written now.
    pub fn status_written(&self, key: &JobKey) {
        if let Some(p) = self.inner.jobs().get_mut(key) {
            p.status_written = Some(Instant::now());
        }
    }

    /// Forgets the job of `key` once its final status is cached: a purge is applied once.
    pub fn forget(&self, key: &JobKey) {
        self.inner.jobs().remove(key);
    }

    /// Forgets the jobs for which `keep` is false: their purges were deleted. A job under way
    /// goes on to its end (its pods' queues hold its purges), its progress no longer kept.
    pub fn forget_unless(&self, keep: impl Fn(&JobKey) -> bool) {
        self.inner.jobs().retain(|key, _| keep(key));
    }
}

impl Inner {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<JobKey, Progress>> {
        self.jobs.lock().expect("jobs lock")
    }

    fn update(&self, key: &JobKey, change: impl FnOnce(&mut Progress) -> bool) {
        let notify = {
            let mut jobs = self.jobs();
            jobs.get_mut(key).is_some_and(change)
        };
        if notify {
            (self.notify)(key);
        }
    }

    /// Runs `job`: each tier's passes, in order, until every pod has applied its last.
    async fn run(self: Arc<Self>, job: Job) {
        let tiers = job.tiers.len();
        let mut last_started = vec![false; tiers];
        let mut last_done = vec![false; tiers];
        let mut passes = FuturesUnordered::new();
        for (i, tier) in job.tiers.iter().enumerate() {
            let last = tier.below.is_empty();
            last_started[i] = last;
            passes.push(self.clone().pass(&job, i, last));
        }
        while let Some((tier, last, outcome)) = passes.next().await {
            if let Err(why) = outcome {
                self.update(&job.key, |p| {
                    p.failed = Some(why);
                    true
                });
                return;
            }
            if last {
                last_done[tier] = true;
            }
            for (i, t) in job.tiers.iter().enumerate() {
                if !last_started[i] && t.below.iter().all(|&b| last_done[b]) {
                    last_started[i] = true;
                    passes.push(self.clone().pass(&job, i, true));
                }
            }
        }
        let finished = Timestamp::now();
        let mut done = None;
        self.update(&job.key, |p| {
            p.finished = Some(finished);
            done = Some((p.pods_done, p.objects, finished.duration_since(p.started)));
            true
        });
        // Logged outside the jobs' lock, which every pass and sender takes.
        if let Some((pods, objects, took)) = done {
            let took = format!("{:.3}s", took.as_secs_f64());
            tracing::info!(purge = %job.key, pods, objects, %took, "purge applied");
        }
    }

    /// One pass of `job` on tier `tier` (its `last`, or the first of two): every pod applies it.
    async fn pass(
        self: Arc<Self>,
        job: &Job,
        tier: usize,
        last: bool,
    ) -> (usize, bool, Result<(), String>) {
        let cluster = &job.tiers[tier].name;
        let kept = job.tiers[tier].kept;
        let mut pods = self.pods.of(&job.key.namespace, cluster);
        // A cache with a volume: each of its pods, running or being replaced (its volume is).
        let absent: Vec<Target> = (0..kept.unwrap_or(0))
            .map(|i| format!("{cluster}-{i}"))
            .filter(|name| pods.iter().all(|p| p.name != *name))
            .map(|name| Target {
                uid: String::new(),
                name,
                sidecar: None,
            })
            .collect();
        if let Some(pod) = pods.iter().find(|p| p.sidecar.is_none()) {
            let why = format!(
                "pod {} of CdnCluster {cluster} has no sidecar to apply purges (the operator runs without --nginx-metrics-image)",
                pod.name
            );
            return (tier, last, Err(why));
        }
        let running = pods.len();
        pods.extend(absent);
        if last {
            self.update(&job.key, |p| {
                p.pods += pods.len() as u32;
                false
            });
        }
        let pass = if last { "last" } else { "first" };
        let mut acks = FuturesUnordered::new();
        for (i, pod) in pods.iter().enumerate() {
            let (done, ack) = oneshot::channel();
            let purge = wire::Purge {
                id: format!(
                    "{}/{}/{}/{cluster}/{pass}",
                    job.key.namespace, job.key.name, job.key.uid
                ),
                ..job.purge.clone()
            };
            let item = Item {
                job: job.key.clone(),
                purge,
                cluster: cluster.clone(),
                pod: pod.clone(),
                kept: kept.is_some(),
                done,
            };
            if i < running {
                self.enqueue(item);
            } else {
                self.clone().when_replaced(item, "not running".into());
            }
            acks.push(ack);
        }
        while let Some(ack) = acks.next().await {
            let ack = ack.unwrap_or(Ack::Gone);
            self.update(&job.key, |p| {
                match ack {
                    Ack::Applied(objects) => {
                        p.objects += objects;
                        if last {
                            p.pods_done += 1;
                        }
                    }
                    Ack::Gone if last => p.pods = p.pods.saturating_sub(1),
                    Ack::Gone => {}
                }
                false
            });
        }
        (tier, last, Ok(()))
    }

    /// Queues `item` for its pod, starting the pod's sender if it has none running.
    fn enqueue(self: &Arc<Self>, item: Item) {
        let uid = item.pod.uid.clone();
        let start = {
            let mut queues = self.queues.lock().expect("queues lock");
            // A pod's entry lives as long as its sender, also while the sender's batch is in
            // flight and the queue empty: what comes meanwhile waits for the next batch. (Starting
            // a sender whenever the queue was empty sent a burst one purge per batch, a walk of
            // the pod's cache each.)
            let start = !queues.contains_key(&uid);
            queues.entry(uid.clone()).or_default().push(item);
            start
        };
        if start {
            let inner = self.clone();
            tokio::spawn(async move { inner.send_all(uid).await });
        }
    }

    /// The sender of one pod: sends what its queue holds, in batches, until the queue is empty
    /// (then its entry goes with it); a batch the pod did not apply is sent again, backing off,
    /// while the pod exists.
    async fn send_all(self: Arc<Self>, uid: String) {
        let mut delay = RETRY_FIRST;
        loop {
            let items = {
                let mut queues = self.queues.lock().expect("queues lock");
                let Some(queue) = queues.get_mut(&uid) else {
                    return;
                };
                if queue.is_empty() {
                    queues.remove(&uid);
                    return;
                }
                take_batch(queue)
            };
            let sent = Instant::now();
            let outcome = self.send(&items).await;
            tracing::debug!(
                pod = %items[0].pod.name,
                purges = items.len(),
                took = ?sent.elapsed(),
                ok = outcome.is_ok(),
                read = outcome.as_ref().map_or(0, |a| a.scanned),
                recalled = outcome.as_ref().map_or(0, |a| a.recalled),
                "purge batch"
            );
            match outcome {
                Ok(applied) => {
                    delay = RETRY_FIRST;
                    for (item, objects) in items.into_iter().zip(applied.invalidated) {
                        self.update(&item.job, |p| p.waiting.remove(&item.pod.name).is_some());
                        let _ = item.done.send(Ack::Applied(objects));
                    }
                }
                Err(why) => {
                    for item in &items {
                        let waiting = Waiting {
                            pod: item.pod.name.clone(),
                            cluster: item.cluster.clone(),
                            why: why.clone(),
                        };
                        self.update(&item.job, |p| {
                            p.waiting.insert(item.pod.name.clone(), waiting).is_none()
                        });
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                    let first = &items[0];
                    let still_there = (self.pods.of(&first.job.namespace, &first.cluster))
                        .iter()
                        .any(|p| p.uid == uid);
                    if still_there {
                        let mut queues = self.queues.lock().expect("queues lock");
                        let queue = queues.entry(uid.clone()).or_default();
                        queue.splice(0..0, items);
                    } else {
                        for item in items {
                            if item.kept {
                                self.clone().when_replaced(item, why.clone());
                                continue;
                            }
                            self.update(&item.job, |p| p.waiting.remove(&item.pod.name).is_some());
                            let _ = item.done.send(Ack::Gone);
                        }
                    }
                }
            }
        }
    }

    /// Queues `item`, whose pod keeps its cache on a volume but is not running (`why`: what its
    /// last try met), for the pod of the same name once it runs: the pod that its volume comes
    /// back with. Gone only once its cluster no longer has that pod's volume.
    fn when_replaced(self: Arc<Self>, mut item: Item, why: String) {
        let waiting = Waiting {
            pod: item.pod.name.clone(),
            cluster: item.cluster.clone(),
            why: format!("{why}; its volume keeps the cache: waiting for the pod that replaces it"),
        };
        self.update(&item.job, |p| {
            p.waiting.insert(item.pod.name.clone(), waiting).is_none()
        });
        tokio::spawn(async move {
            let namespace = item.job.namespace.clone();
            loop {
                let pods = self.pods.of(&namespace, &item.cluster);
                let replaced = pods
                    .into_iter()
                    .find(|p| p.name == item.pod.name && p.uid != item.pod.uid);
                if let Some(pod) = replaced {
                    item.pod = pod;
                    self.enqueue(item);
                    return;
                }
                if !(self.kept)(&namespace, &item.cluster, &item.pod.name) {
                    self.update(&item.job, |p| p.waiting.remove(&item.pod.name).is_some());
                    let _ = item.done.send(Ack::Gone);
                    return;
                }
                tokio::time::sleep(REPLACED_EVERY).await;
            }
        });
    }

    /// Sends `items` to their pod as one signed batch; what it applied, or why not.
    async fn send(&self, items: &[Item]) -> Result<Applied, String> {
        let first = &items[0];
        let Some(address) = first.pod.sidecar else {
            // A pod of a cache with a volume, replaced by one without a sidecar.
            return Err(format!(
                "pod {} has no sidecar to apply purges",
                first.pod.name
            ));
        };
        let issued = Timestamp::now().as_second();
        let batch = Batch {
            id: batch_id(),
            issued,
            expires: issued + wire::VALIDITY_SECONDS,
            cluster: format!("{}/{}", first.job.namespace, first.cluster),
            purges: items.iter().map(|i| i.purge.clone()).collect(),
        };
        let body = serde_json::to_vec(&batch).expect("a batch serializes");
        let signature = wire::signature_header(&self.signer.sign(&body));
        let request = http::Request::post(format!("http://{address}{}", wire::PURGE_PATH))
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(wire::SIGNATURE_HEADER, signature)
            .body(Full::new(bytes::Bytes::from(body)))
            .expect("a valid request");
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !status.is_success() {
                let text = String::from_utf8_lossy(&body);
                return Err(format!("its sidecar answered {status}: {}", text.trim()));
            }
            let applied: Applied = serde_json::from_slice(&body)
                .map_err(|e| format!("its sidecar answered what is not a purge report: {e}"))?;
            if applied.invalidated.len() != items.len() {
                return Err(format!(
                    "its sidecar reported {} purges of {}",
                    applied.invalidated.len(),
                    items.len()
                ));
            }
            Ok(applied)
        };
        match tokio::time::timeout(SEND_TIMEOUT, exchange).await {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(why)) => Err(format!("{address}: {why}")),
            Err(_) => Err(format!(
                "{address}: no answer in {}s",
                SEND_TIMEOUT.as_secs()
            )),
        }
    }
}

/// The first items of `queue` that fit in one batch (one at least). A job's two passes on a
/// pod (queued together when the first was retried) go in two walks: a walk credits a file to
/// every purge that names it, and the second pass must count only what was fetched again after
/// the first, not the same files twice.
fn take_batch(queue: &mut Vec<Item>) -> Vec<Item> {
    let mut size = 0;
    let mut count = 0;
    let mut jobs = std::collections::HashSet::new();
    for item in queue.iter() {
        size += serde_json::to_vec(&item.purge)
            .map(|v| v.len())
            .unwrap_or(0)
            + 1;
        let again = !jobs.insert(&item.job);
        if count > 0 && (again || size > wire::MAX_BATCH_BYTES - 1024) {
            break;
        }
        count += 1;
    }
    queue.drain(..count).collect()
}

/// A batch id no other batch has: 128 random bits.
fn batch_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system has a random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A sidecar that takes `APPLY` per batch and records each batch's size and how many were
    /// in flight at once.
    async fn sidecar() -> (
        std::net::SocketAddr,
        Arc<Mutex<Vec<usize>>>,
        Arc<AtomicUsize>,
    ) {
        const APPLY: Duration = Duration::from_millis(40);
        let batches = Arc::new(Mutex::new(Vec::new()));
        let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let router = axum::Router::new().route(
            wire::PURGE_PATH,
            axum::routing::post({
                let (batches, most) = (batches.clone(), most.clone());
                move |body: bytes::Bytes| async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let batch: Batch = serde_json::from_slice(&body).unwrap();
                    batches.lock().unwrap().push(batch.purges.len());
                    tokio::time::sleep(APPLY).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    serde_json::to_string(&Applied {
                        invalidated: vec![1; batch.purges.len()],
                        ..Applied::default()
                    })
                    .unwrap()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (address, batches, most)
    }

    fn item(job: &str, pass: &str) -> Item {
        Item {
            job: JobKey {
                namespace: "ns".into(),
                name: job.into(),
                uid: format!("uid-{job}"),
            },
            purge: wire::Purge {
                id: format!("{job}/{pass}"),
                ..wire::Purge::default()
            },
            cluster: "cache".into(),
            pod: Target {
                uid: "uid-cache-0".into(),
                name: "cache-0".into(),
                sidecar: None,
            },
            kept: false,
            done: oneshot::channel().0,
        }
    }

    #[test]
    fn a_jobs_two_passes_on_a_pod_go_in_two_batches() {
        let mut queue = vec![
            item("a", "first"),
            item("b", "last"),
            item("a", "last"),
            item("c", "last"),
        ];
        let ids = |batch: Vec<Item>| batch.into_iter().map(|i| i.purge.id).collect::<Vec<_>>();
        assert_eq!(ids(take_batch(&mut queue)), ["a/first", "b/last"]);
        assert_eq!(ids(take_batch(&mut queue)), ["a/last", "c/last"]);
        assert!(queue.is_empty());
    }

    /// A burst for one pod, its purges arriving while a batch is in flight: one sender, the
    /// purges that came meanwhile in its next batch (one walk of the pod's cache each).
    #[tokio::test]
    async fn a_burst_for_a_pod_goes_in_a_few_batches_one_at_a_time() {
        const PURGES: usize = 200;
        let (address, batches, most_in_flight) = sidecar().await;
        let dispatcher = Dispatcher::new(
            Arc::new(Signer::generate().0),
            PodTargets::default(),
            Arc::new(|_, _, _| false),
            Arc::new(|_| {}),
        );
        let pod = Target {
            uid: "uid-cache-0".into(),
            name: "cache-0".into(),
            sidecar: Some(address),
        };
        let mut acks = Vec::new();
        for i in 0..PURGES {
            let (done, ack) = oneshot::channel();
            dispatcher.inner.enqueue(Item {
                job: JobKey {
                    namespace: "ns".into(),
                    name: format!("purge-{i}"),
                    uid: format!("uid-{i}"),
                },
                purge: wire::Purge {
                    id: format!("purge-{i}"),
                    paths: vec![format!("/{i}")],
                    ..wire::Purge::default()
                },
                cluster: "cache".into(),
                pod: pod.clone(),
                kept: false,
                done,
            });
            acks.push(ack);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for ack in acks {
            assert!(matches!(ack.await, Ok(Ack::Applied(1))));
        }
        let batches = batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), PURGES, "{batches:?}");
        assert_eq!(most_in_flight.load(Ordering::SeqCst), 1, "{batches:?}");
        // About one batch per 40 ms of arrivals (200 purges over more than 200 ms), not one
        // per purge.
        assert!(
            batches.len() <= PURGES / 10,
            "{} batches: {batches:?}",
            batches.len()
        );
        assert!(dispatcher.inner.queues.lock().unwrap().is_empty());
    }

    /// A cache with a volume: a purge waits for the pod being replaced (its volume comes back
    /// with it), and is applied to the pod of the same name once it runs; a pod whose volume the
    /// cluster no longer has (scaled down) is gone.
    #[tokio::test]
    async fn a_purge_waits_for_the_replaced_pod_of_a_cache_with_a_volume() {
        use crate::kubernetes::index::Index;
        let (address, batches, _) = sidecar().await;
        let targets = PodTargets::default();
        let mut pods = targets.writer();
        let running = |name: &str| {
            let ip = address.ip().to_string();
            super::super::pods::test_pod(name, "cache", "Running", Some(&ip), address.port())
        };
        pods.apply(&running("cache-0"));
        let kept = Arc::new(std::sync::atomic::AtomicU32::new(2));
        let dispatcher = Dispatcher::new(
            Arc::new(Signer::generate().0),
            targets,
            {
                let kept = kept.clone();
                Arc::new(move |_, _, pod: &str| {
                    let ordinal: u32 = pod.trim_start_matches("cache-").parse().unwrap();
                    ordinal < kept.load(Ordering::SeqCst)
                })
            },
            Arc::new(|_| {}),
        );
        let job = |name: &str| Job {
            key: JobKey {
                namespace: "ns".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            purge: wire::Purge {
                paths: vec!["/a".into()],
                ..wire::Purge::default()
            },
            tiers: vec![Tier {
                name: "cache".into(),
                below: Default::default(),
                kept: Some(2),
            }],
        };
        let progress = |name: &str| {
            dispatcher
                .progress(&JobKey {
                    namespace: "ns".into(),
                    name: name.into(),
                    uid: format!("uid-{name}"),
                })
                .unwrap()
        };
        dispatcher.start(job("a"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p = progress("a");
        assert_eq!((p.pods, p.pods_done, p.finished), (2, 1, None), "{p:?}");
        let why = &p.waiting["cache-1"].why;
        assert!(
            why.contains("waiting for the pod that replaces it"),
            "{why}"
        );

        // The replacing pod runs: the purge reaches it.
        pods.apply(&running("cache-1"));
        tokio::time::sleep(REPLACED_EVERY + Duration::from_millis(500)).await;
        let p = progress("a");
        assert_eq!((p.pods, p.pods_done), (2, 2), "{p:?}");
        assert!(p.finished.is_some() && p.waiting.is_empty(), "{p:?}");
        assert_eq!(batches.lock().unwrap().len(), 2);

        // Scaled down while its pod was away: its claim is deleted with it, nothing to wait for.
        pods.delete(&running("cache-1"));
        dispatcher.start(job("b"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(progress("b").finished.is_none());
        kept.store(1, Ordering::SeqCst);
        tokio::time::sleep(REPLACED_EVERY + Duration::from_millis(500)).await;
        let p = progress("b");
        assert_eq!((p.pods, p.pods_done), (1, 1), "{p:?}");
        assert!(p.finished.is_some(), "{p:?}");
    }
}
