//! Applying purges to pods: each purge is a job that walks its tiers (the cache clusters it
//! reaches, [`super::targets`]), each tier's pods applying it; each pod has one queue, whose
//! purges go out together, in one signed batch, one walk of its cache. So a burst of purges costs
//! each pod a few walks, not one per purge.
//!
//! The order of the tiers: a cache cluster with cache clusters below it is purged at once (its
//! viewers stop getting what was purged) and again once every cluster below it has applied the
//! purge, as it may have fetched a purged object again from one of them meanwhile. A pod that
//! does not answer is retried, backing off, for as long as it exists: a purge is complete once
//! every pod has applied it, or is gone.

use super::signing::Signer;
use super::targets::Tier;
use crate::nginx_cache::wire::{self, Applied, Batch};
use crate::nginx_metrics;
use futures::stream::{FuturesUnordered, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a pod has to answer a batch: its walk waits up to 30 s for the fills in flight.
const SEND_TIMEOUT: Duration = Duration::from_secs(90);
/// The waits between a pod's failed tries: doubled from the first to the last.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(15);
/// How long a list of a cluster's pods is reused: a burst of purges lists each cluster once.
const PODS_FRESH: Duration = Duration::from_secs(1);

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
    /// Pods that must apply it (its last pass on each tier), as far as listed yet.
    pub pods: u32,
    /// Those that did.
    pub pods_done: u32,
    /// Objects invalidated, over every pod and pass.
    pub objects: u64,
    /// The pods that did not answer their last try, by name.
    pub waiting: BTreeMap<String, Waiting>,
    /// Why it cannot be applied at all.
    pub failed: Option<String>,
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
        }
    }

    /// Whether nothing more happens to it.
    pub fn is_over(&self) -> bool {
        self.finished.is_some() || self.failed.is_some()
    }
}

/// A pod of a tier, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub uid: String,
    pub name: String,
    /// Its sidecar's address; `None` when the pod has no sidecar.
    pub sidecar: Option<SocketAddr>,
}

impl Target {
    /// `pod` as a purge reaches it: running with an address (a pod not started yet holds
    /// nothing), its sidecar's port from its spec. `None` for a pod that holds no cache.
    pub fn of(pod: &Pod) -> Option<Target> {
        let status = pod.status.as_ref()?;
        if status.phase.as_deref() != Some("Running") {
            return None;
        }
        let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
        let port = pod
            .spec
            .as_ref()?
            .init_containers
            .iter()
            .flatten()
            .chain(pod.spec.as_ref()?.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(nginx_metrics::PORT_NAME))
            .and_then(|p| u16::try_from(p.container_port).ok());
        Some(Target {
            uid: pod.uid().unwrap_or_default(),
            name: pod.name_any(),
            sidecar: port.map(|port| SocketAddr::new(ip, port)),
        })
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
    client: kube::Client,
    signer: Arc<Signer>,
    http: HttpClient<hyper_util::client::legacy::connect::HttpConnector, Full<bytes::Bytes>>,
    jobs: Mutex<HashMap<JobKey, Progress>>,
    queues: Mutex<HashMap<String, Vec<Item>>>,
    pods: tokio::sync::Mutex<PodLists>,
    notify: Notify,
}

/// The last list of each cluster's pods (by namespace and cluster), and when it was made.
type PodLists = HashMap<(String, String), (Instant, Arc<Vec<Target>>)>;

/// A purge waiting in a pod's queue.
struct Item {
    job: JobKey,
    purge: wire::Purge,
    cluster: String,
    pod: Target,
    done: oneshot::Sender<Ack>,
}

/// What became of a purge on a pod.
enum Ack {
    Applied(u64),
    /// The pod is gone (or no longer running): nothing left to purge there.
    Gone,
}

impl Dispatcher {
    pub fn new(client: kube::Client, signer: Arc<Signer>, notify: Notify) -> Self {
        let http = HttpClient::builder(TokioExecutor::new()).build_http();
        Dispatcher {
            inner: Arc::new(Inner {
                client,
                signer,
                http,
                jobs: Mutex::default(),
                queues: Mutex::default(),
                pods: tokio::sync::Mutex::default(),
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
        self.update(&job.key, |p| {
            p.finished = Some(Timestamp::now());
            true
        });
    }

    /// One pass of `job` on tier `tier` (its `last`, or the first of two): every pod applies it.
    async fn pass(
        self: Arc<Self>,
        job: &Job,
        tier: usize,
        last: bool,
    ) -> (usize, bool, Result<(), String>) {
        let cluster = &job.tiers[tier].name;
        let pods = self.pods_of(&job.key, cluster).await;
        if let Some(pod) = pods.iter().find(|p| p.sidecar.is_none()) {
            let why = format!(
                "pod {} of CdnCluster {cluster} has no sidecar to apply purges (the operator runs without --nginx-metrics-image)",
                pod.name
            );
            return (tier, last, Err(why));
        }
        if last {
            self.update(&job.key, |p| {
                p.pods += pods.len() as u32;
                false
            });
        }
        let pass = if last { "last" } else { "first" };
        let mut acks = FuturesUnordered::new();
        for pod in pods.iter() {
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
                done,
            };
            self.enqueue(item);
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

    /// The pods of `cluster` that hold a cache, listed at most [`PODS_FRESH`] ago; retried,
    /// with the job told why, until the API server answers.
    async fn pods_of(&self, job: &JobKey, cluster: &str) -> Arc<Vec<Target>> {
        let mut delay = RETRY_FIRST;
        loop {
            match self.list(&job.namespace, cluster, false).await {
                Ok(pods) => return pods,
                Err(error) => {
                    self.update(job, |p| {
                        let waiting = Waiting {
                            pod: String::new(),
                            cluster: cluster.to_string(),
                            why: format!(
                                "cannot list its pods: {}",
                                crate::reconcile::describe(&error)
                            ),
                        };
                        p.waiting.insert(String::new(), waiting).is_none()
                    });
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    async fn list(
        &self,
        namespace: &str,
        cluster: &str,
        fresh: bool,
    ) -> kube::Result<Arc<Vec<Target>>> {
        let mut lists = self.pods.lock().await;
        let key = (namespace.to_string(), cluster.to_string());
        if let Some((when, pods)) = lists.get(&key) {
            if !fresh && when.elapsed() < PODS_FRESH {
                return Ok(pods.clone());
            }
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let selector = crate::cdncluster::build::pod_selector_string(cluster);
        let listed = api.list(&ListParams::default().labels(&selector)).await?;
        let pods: Arc<Vec<Target>> = Arc::new(listed.items.iter().filter_map(Target::of).collect());
        lists.insert(key, (Instant::now(), pods.clone()));
        Ok(pods)
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
            match self.send(&items).await {
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
                    let still_there =
                        match self.list(&first.job.namespace, &first.cluster, true).await {
                            Ok(pods) => pods.iter().any(|p| p.uid == uid),
                            // Unknown: tried again.
                            Err(_) => true,
                        };
                    if still_there {
                        let mut queues = self.queues.lock().expect("queues lock");
                        let queue = queues.entry(uid.clone()).or_default();
                        queue.splice(0..0, items);
                    } else {
                        for item in items {
                            self.update(&item.job, |p| p.waiting.remove(&item.pod.name).is_some());
                            let _ = item.done.send(Ack::Gone);
                        }
                    }
                }
            }
        }
    }

    /// Sends `items` to their pod as one signed batch; what it applied, or why not.
    async fn send(&self, items: &[Item]) -> Result<Applied, String> {
        let first = &items[0];
        let address = first
            .pod
            .sidecar
            .expect("pods without a sidecar fail their pass");
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
    async fn sidecar() -> (SocketAddr, Arc<Mutex<Vec<usize>>>, Arc<AtomicUsize>) {
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
                        scanned: 0,
                        fills_awaited: 0,
                        fills_unchecked: 0,
                        millis: 0,
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

    fn no_api() -> kube::Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<Full<bytes::Bytes>>, _>(std::io::Error::other("no API here"))
        });
        kube::Client::new(service, "default")
    }

    /// A burst for one pod, its purges arriving while a batch is in flight: one sender, the
    /// purges that came meanwhile in its next batch (one walk of the pod's cache each).
    #[tokio::test]
    async fn a_burst_for_a_pod_goes_in_a_few_batches_one_at_a_time() {
        const PURGES: usize = 200;
        let (address, batches, most_in_flight) = sidecar().await;
        let dispatcher =
            Dispatcher::new(no_api(), Arc::new(Signer::generate().0), Arc::new(|_| {}));
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
}
