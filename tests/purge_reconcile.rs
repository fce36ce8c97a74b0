//! The CdnPurge controller against the in-memory API (kube-fake-client), its pods' sidecars real
//! (`cdn-operator nginx-metrics`, each on a loopback port of its own, with a cache folder of
//! files as nginx writes them): a purge reaches every cache below its CdnCluster and completes
//! with one status write and one Event; a pod that does not answer is waited for and said; a
//! purge that cannot be applied fails once, saying why; a purge over writes nothing more.
//!
//! The fake serves no watches: each step fills the controller's caches from the API before it
//! reconciles.

mod support;

use cdn_operator::api::{
    CdnCluster, CdnClusterSpec, CdnPurge, CdnPurgeSpec, PurgePhase, Role, Source,
};
use cdn_operator::cdncluster::build;
use cdn_operator::kubernetes::events::Events;
use cdn_operator::kubernetes::index::{Index, Reset};
use cdn_operator::kubernetes::problems::{PodSummary, INSTANCE_LABEL};
use cdn_operator::nginx_cache::{file, wire};
use cdn_operator::purge::dispatch::{Dispatcher, JobKey};
use cdn_operator::purge::pods::{PodTargets, PodTargetsWriter};
use cdn_operator::purge::signing::Signer;
use cdn_operator::purge::{self, PurgeSummary};
use cdn_operator::reconcile::Shared;
use cdn_operator_testkit::{free_port, settle};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::Client;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const NS: &str = "default";
/// When the objects of the caches were fetched: before any purge of the test.
const FETCHED: i64 = 1_700_000_000;

/// A pod's sidecar, running.
struct Sidecar {
    child: std::process::Child,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the sidecar of a pod of `cluster` whose cache is `cache`, trusting the keys of `keys`.
fn sidecar(cluster: &str, dir: &Path, cache: &Path, keys: &Path, port: u16) -> Sidecar {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_cdn-operator"))
        .arg("nginx-metrics")
        .arg("--log")
        .arg(dir.join(format!("{port}.log")))
        .arg("--nginx-status")
        .arg(dir.join(format!("{port}.sock")))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--cdncluster", cluster, "--role", "cache"])
        .arg("--cache-dir")
        .arg(cache)
        .args(["--cache-max-size", "1000000"])
        .arg("--purge-keys")
        .arg(keys)
        .args(["--namespace", NS])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("the sidecar starts");
    let up = settle(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        |up| *up,
    );
    assert!(up, "the sidecar serves on {port}");
    Sidecar { child }
}

/// A cache folder holding `objects` (paths) of host `cdn.example`, as nginx writes them.
fn cache(dir: &Path, name: &str, objects: &[&str]) -> PathBuf {
    let folder = dir.join(name);
    for (i, path) in objects.iter().enumerate() {
        let file_dir = folder.join(format!("{}/{:02x}", i % 16, i % 256));
        std::fs::create_dir_all(&file_dir).unwrap();
        let key = format!("GETcdn.example{path}bytes=0-1048575");
        let bytes = file::format(
            &key,
            FETCHED,
            FETCHED + 86_400,
            "HTTP/1.1 200 OK\r\n\r\n",
            b"x",
        );
        std::fs::write(file_dir.join(format!("{i:032x}")), bytes).unwrap();
    }
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

/// Whether the object at `path` of the cache `folder` is still served (not hard-purged).
fn live(folder: &Path, path: &str) -> bool {
    walk(folder).into_iter().any(|f| {
        let object = file::parse(&std::fs::read(&f).unwrap()).unwrap();
        object.key.contains(path) && object.is_live()
    })
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// The labels of a pod of `cluster` that the CdnClusters' watch of their pods reads: the
/// cluster's instance, and its Deployment's selector.
fn pod_labels(cluster: &str) -> serde_json::Value {
    let mut labels = build::pod_selector(cluster);
    labels.insert(INSTANCE_LABEL.into(), cluster.into());
    json!(labels)
}

/// A pod of `cluster` as a kubelet reports it: running at 127.0.0.1, its sidecar's port.
fn pod(cluster: &str, name: &str, port: Option<u16>) -> serde_json::Value {
    let sidecar = port.map(|port| {
        json!([{"name": "metrics", "image": "cdn-operator", "restartPolicy": "Always",
                "ports": [{"name": "metrics", "containerPort": port}]}])
    });
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid"),
                     "labels": pod_labels(cluster)},
        "spec": {"initContainers": sidecar.unwrap_or(json!([])),
                 "containers": [{"name": "nginx", "image": "nginx"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    })
}

fn cluster(name: &str, role: Role, sources: &[&str]) -> serde_json::Value {
    let mut sources: Vec<Source> = sources.iter().map(|s| Source::cluster(s, None)).collect();
    if role == Role::Cache {
        sources.push(Source::url("origin", "http://origin.example", None));
    }
    let mut c = CdnCluster::new(name, CdnClusterSpec::new(role, sources));
    c.metadata.namespace = Some(NS.into());
    serde_json::to_value(c).unwrap()
}

/// The in-memory API with `edge` (a balancer) over the caches `mid` and `shield` (`mid` fetching
/// through `shield`), their pods, and the operator's key.
struct World {
    fake: support::FakeApi,
    client: Client,
    events: Events,
    dir: tempfile::TempDir,
    /// Kept running for the test's length.
    _sidecars: Vec<Sidecar>,
    /// Told when a job's progress calls for a reconcile.
    progress: mpsc::UnboundedReceiver<JobKey>,
    dispatcher: Dispatcher,
    /// Feeds the dispatcher's pods, as their watch would.
    pod_watch: PodTargetsWriter,
}

const OBJECTS: [&str; 4] = ["/vod/a/1.ts", "/vod/a/2.ts", "/vod/b/1.ts", "/live/x.m3u8"];

impl World {
    /// `pods`: (cluster, pod name, whether its sidecar runs).
    async fn new(pods: &[(&str, &str, bool)]) -> World {
        let dir = tempfile::tempdir().unwrap();
        let (signer, _) = Signer::generate();
        let keys = dir.path().join(wire::PUBLIC_KEYS_KEY);
        std::fs::write(&keys, signer.public_keys_file()).unwrap();
        let mut objects = vec![
            cluster("edge", Role::Balancer, &["mid"]),
            cluster("mid", Role::Cache, &["shield"]),
            cluster("shield", Role::Cache, &[]),
        ];
        let mut sidecars = Vec::new();
        for (cluster, name, runs) in pods {
            let port = free_port();
            if *runs {
                let folder = cache(dir.path(), name, &OBJECTS);
                sidecars.push(sidecar(cluster, dir.path(), &folder, &keys, port));
            }
            objects.push(pod(cluster, name, Some(port)));
        }
        let fake = support::FakeApi::with_purges(objects).await;
        // The pods as the CdnClusters' watch of their pods lists them.
        let pods = PodTargets::default();
        let mut pod_watch = pods.writer();
        let listed = Api::<Pod>::namespaced(fake.client.clone(), NS)
            .list(&ListParams::default())
            .await
            .unwrap();
        pod_watch.reset(Reset::Begin);
        for pod in &listed.items {
            pod_watch.reset(Reset::Listed(&PodSummary::of(pod)));
        }
        pod_watch.reset(Reset::Done);
        let (tx, progress) = mpsc::unbounded_channel();
        let signer = Arc::new(signer);
        let kept = cdn_operator::purge::kept_volumes(fake.store().await);
        let dispatcher = Dispatcher::new(
            signer,
            pods,
            kept,
            Arc::new(move |key: &JobKey| {
                let _ = tx.send(key.clone());
            }),
        );
        World {
            client: fake.client.clone(),
            events: Events::new(fake.client.clone(), Some("test".into())),
            fake,
            dir,
            _sidecars: sidecars,
            progress,
            dispatcher,
            pod_watch,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Creates a purge as a user would.
    async fn create(&self, name: &str, spec: CdnPurgeSpec) {
        let mut purge = CdnPurge::new(name, spec);
        purge.metadata.namespace = Some(NS.into());
        self.api::<CdnPurge>()
            .create(&PostParams::default(), &purge)
            .await
            .unwrap();
        self.fake.take_writes();
    }

    /// The controller's context, its caches as fresh as the watches would make them.
    async fn context(&self, dispatcher: Result<Dispatcher, String>) -> Arc<purge::Context> {
        Arc::new(purge::Context {
            shared: Shared::new(self.client.clone(), self.events.clone(), Default::default()),
            purges: self.fake.store::<PurgeSummary>().await,
            arrivals: Default::default(),
            clusters: self.fake.store::<CdnCluster>().await,
            clusters_ready: Default::default(),
            dispatcher,
        })
    }

    async fn reconcile(&self, name: &str) -> Action {
        self.reconcile_with(name, Ok(self.dispatcher.clone())).await
    }

    async fn reconcile_with(&self, name: &str, dispatcher: Result<Dispatcher, String>) -> Action {
        let ctx = self.context(dispatcher).await;
        let purge = ctx
            .purges
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(NS))
            .expect("the purge is cached");
        purge::reconcile(purge, ctx).await.expect("reconciled")
    }

    /// Waits until the job of `name` tells it has news, then reconciles it.
    async fn reconcile_on_progress(&mut self, name: &str) -> Action {
        let key = tokio::time::timeout(Duration::from_secs(30), self.progress.recv())
            .await
            .expect("the job tells its progress")
            .unwrap();
        assert_eq!(key.name, name);
        self.reconcile(name).await
    }

    async fn purge(&self, name: &str) -> CdnPurge {
        self.api::<CdnPurge>().get(name).await.unwrap()
    }

    /// Every Event about `name`, as (type, reason, note).
    async fn events(&self, name: &str) -> Vec<(String, String, String)> {
        let mut events: Vec<Event> = self.api().list(&ListParams::default()).await.unwrap().items;
        // Listed by name, which is random: in the order they happened.
        events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        events
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }

    fn folder(&self, pod: &str) -> PathBuf {
        self.dir.path().join(pod)
    }
}

fn ready(purge: &CdnPurge) -> (String, String, String) {
    let c = purge
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .expect("a Ready condition");
    (
        c.status.to_string(),
        c.reason.to_string(),
        c.message.to_string(),
    )
}

#[tokio::test]
async fn a_purge_of_the_edge_reaches_every_cache_below_it_and_completes_with_one_write() {
    let mut w = World::new(&[
        ("mid", "mid-1", true),
        ("mid", "mid-2", true),
        ("shield", "shield-1", true),
    ])
    .await;
    let mut spec = CdnPurgeSpec::paths("edge", &[]);
    spec.paths = None;
    spec.prefixes = Some(vec!["/vod/a/".into()]);
    w.create("fix-a", spec).await;
    // Started: no write yet, looked at again when the first report is due.
    let action = w.reconcile("fix-a").await;
    assert_eq!(w.fake.take_writes(), Vec::<String>::new());
    assert!(action != Action::await_change(), "{action:?}");
    let action = w.reconcile_on_progress("fix-a").await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        w.fake.take_writes(),
        ["status CdnPurge fix-a", "create Event"],
        "one status write, one Event"
    );
    let purge = w.purge("fix-a").await;
    let status = purge.status.clone().unwrap();
    assert_eq!(status.phase, Some(PurgePhase::Complete));
    assert_eq!(status.clusters, ["shield", "mid"], "the deepest first");
    assert_eq!((status.pods, status.pods_purged), (Some(3), Some(3)));
    assert_eq!(status.progress.as_deref(), Some("3/3"));
    // Two objects on each of three pods; mid's pods apply it twice (its last pass finds
    // nothing more).
    assert_eq!(status.objects, Some(6));
    let (value, reason, message) = ready(&purge);
    assert_eq!((value.as_str(), reason.as_str()), ("True", "Complete"));
    assert!(
        message.starts_with("6 objects invalidated on 3 pods of shield, mid in "),
        "{message}"
    );
    assert_eq!(
        w.events("fix-a").await,
        [("Normal".to_string(), "Purged".to_string(), message)]
    );
    for pod in ["mid-1", "mid-2", "shield-1"] {
        assert!(!live(&w.folder(pod), "/vod/a/1.ts"), "{pod}");
        assert!(!live(&w.folder(pod), "/vod/a/2.ts"), "{pod}");
        assert!(
            live(&w.folder(pod), "/vod/b/1.ts"),
            "{pod}: not named, kept"
        );
        assert!(
            live(&w.folder(pod), "/live/x.m3u8"),
            "{pod}: not named, kept"
        );
    }
    // Over: nothing more is written, however often it is reconciled.
    assert_eq!(w.reconcile("fix-a").await, Action::await_change());
    assert_eq!(w.reconcile("fix-a").await, Action::await_change());
    assert_eq!(w.fake.take_writes(), Vec::<String>::new());
}

#[tokio::test]
async fn a_pod_that_does_not_answer_keeps_the_purge_waiting_and_says_so_until_it_is_gone() {
    // mid-2's sidecar does not run: its pod is listed, running, and refuses connections.
    let mut w = World::new(&[
        ("mid", "mid-1", true),
        ("mid", "mid-2", false),
        ("shield", "shield-1", true),
    ])
    .await;
    w.create("fix", CdnPurgeSpec::paths("mid", &["/live/x.m3u8"]))
        .await;
    w.reconcile("fix").await;
    // The first refusal is news; the report is due after REPORT_AFTER.
    let _ = tokio::time::timeout(Duration::from_secs(10), w.progress.recv()).await;
    tokio::time::sleep(purge::REPORT_AFTER).await;
    let action = w.reconcile("fix").await;
    assert!(action != Action::await_change());
    assert_eq!(
        w.fake.take_writes(),
        ["status CdnPurge fix", "create Event"]
    );
    let purge = w.purge("fix").await;
    let status = purge.status.clone().unwrap();
    assert_eq!(status.phase, Some(PurgePhase::Purging));
    let (value, reason, message) = ready(&purge);
    assert_eq!((value.as_str(), reason.as_str()), ("False", "PodNotPurged"));
    assert!(
        message.contains("waiting for pod mid-2 of CdnCluster mid: 127.0.0.1:"),
        "{message}"
    );
    assert!(
        message.contains("retried until it applies the purge or is gone"),
        "{message}"
    );
    assert_eq!(w.events("fix").await[0].1, "PurgeRetrying");
    // Nothing new: nothing written.
    w.reconcile("fix").await;
    assert_eq!(w.fake.take_writes(), Vec::<String>::new());
    // The pod is deleted (a rollout replaced it): the purge completes without it.
    let gone = w.api::<Pod>().get("mid-2").await.unwrap();
    w.api::<Pod>()
        .delete("mid-2", &DeleteParams::default())
        .await
        .unwrap();
    w.pod_watch.delete(&PodSummary::of(&gone));
    w.fake.take_writes();
    loop {
        let action = w.reconcile_on_progress("fix").await;
        if action == Action::await_change() {
            break;
        }
    }
    let status = w.purge("fix").await.status.unwrap();
    assert_eq!(status.phase, Some(PurgePhase::Complete));
    assert_eq!(status.progress.as_deref(), Some("2/2"));
    let reasons: Vec<String> = w.events("fix").await.into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["PurgeRetrying", "Purged"]);
}

#[tokio::test]
async fn a_purge_that_cannot_be_applied_fails_once_saying_why() {
    let w = World::new(&[("mid", "mid-1", true)]).await;
    // An unknown CdnCluster.
    w.create("nowhere", CdnPurgeSpec::paths("cdn-that-is-not", &["/a"]))
        .await;
    assert_eq!(w.reconcile("nowhere").await, Action::await_change());
    assert_eq!(
        w.fake.take_writes(),
        ["status CdnPurge nowhere", "create Event"]
    );
    let purge = w.purge("nowhere").await;
    assert_eq!(
        purge.status.as_ref().unwrap().phase,
        Some(PurgePhase::Failed)
    );
    let (_, reason, message) = ready(&purge);
    assert_eq!(reason, "CdnClusterNotFound");
    assert_eq!(
        message,
        "there is no CdnCluster cdn-that-is-not in the namespace"
    );
    // A regular expression the API server's CEL (Go's RE2) takes but the sidecars' engine (Rust's
    // regex) does not (a quoted literal): refused by the operator, before any pod sees it.
    let mut spec = CdnPurgeSpec::paths("edge", &[]);
    spec.paths = None;
    spec.regexes = Some(vec![r"/vod/\Qa.b\E".into()]);
    w.create("lookahead", spec).await;
    w.reconcile("lookahead").await;
    let (_, reason, message) = ready(&w.purge("lookahead").await);
    assert_eq!(reason, "InvalidPurge");
    assert!(message.contains("is invalid"), "{message}");
    // No key to sign with.
    w.create("unsigned", CdnPurgeSpec::paths("edge", &["/a"]))
        .await;
    w.reconcile_with("unsigned", Err("cannot read Secret x: forbidden".into()))
        .await;
    let (_, reason, message) = ready(&w.purge("unsigned").await);
    assert_eq!(reason, "NoSigningKey");
    assert_eq!(
        message,
        "the operator cannot sign purges: cannot read Secret x: forbidden"
    );
    w.fake.take_writes();
    for name in ["nowhere", "lookahead", "unsigned"] {
        assert_eq!(w.reconcile(name).await, Action::await_change());
        assert_eq!(w.events(name).await.len(), 1, "{name}: one Warning");
    }
    assert_eq!(
        w.fake.take_writes(),
        Vec::<String>::new(),
        "failed once, for good"
    );
    // No pod was asked to apply anything.
    for path in OBJECTS {
        assert!(live(&w.folder("mid-1"), path), "{path}");
    }
}
