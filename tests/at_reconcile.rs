//! The At controller's reconcile against the in-memory API server of kube-fake-client.
//!
//! The fake treats server-side apply as a JSON merge patch and deletes at once (it ignores
//! finalizers), so a pod "being deleted" is set up as an initial object carrying a
//! deletionTimestamp and the operator's finalizer. The caches the controller reads are filled by
//! the tests from the fake (`sync`), or on purpose left stale.

use cdn_operator::api::{At, AtSpec, Outcome, Phase};
use cdn_operator::at::{self, build, status, Clock, Context};
use cdn_operator::kubernetes::cache::CachesReady;
use cdn_operator::kubernetes::events::Events;
use cdn_operator::reconcile::{self, Shared};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, store::Writer, ObjectRef};
use kube::ResourceExt;
use kube_fake_client::ClientBuilder;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use support::{fill, FakeApi, Request, TestClock};

mod support;

const NS: &str = "default";
const NOW: &str = "2030-01-01T00:00:00Z";
const PAST: &str = "2019-04-12T10:12:00Z";

/// The At controller over the shared in-memory API: its context, and the writers of its caches.
struct Harness {
    fake: FakeApi,
    ctx: Arc<Context>,
    ats: Writer<At>,
    pods: Writer<Pod>,
    clock: Arc<TestClock>,
}

impl Harness {
    /// A fake API server holding `objects`, the clock at `NOW`, caches synced.
    async fn new(objects: Vec<Value>) -> Harness {
        let fake = FakeApi::over(
            ClientBuilder::new()
                .with_resource::<At>()
                .with_status_subresource::<At>()
                .with_status_subresource::<Pod>()
                .with_runtime_objects(objects),
        )
        .await;
        let (at_store, ats) = reflector::store();
        let (pod_store, pods) = reflector::store();
        let clock = TestClock::at(NOW);
        let ctx = Arc::new(Context {
            shared: Shared::new(
                fake.client.clone(),
                Events::new(fake.client.clone(), None),
                CachesReady::default(),
            ),
            ats: at_store,
            pods: pod_store,
            clock: clock.clone(),
            default_image: cdn_operator::at::build::DEFAULT_IMAGE.into(),
        });
        let mut harness = Harness {
            fake,
            ctx,
            ats,
            pods,
            clock,
        };
        harness.sync().await;
        harness
    }

    async fn with_at(name: &str, schedule: &str) -> Harness {
        Harness::new(vec![at_value(name, schedule)]).await
    }

    fn at_api(&self) -> Api<At> {
        Api::namespaced(self.fake.client.clone(), NS)
    }

    fn pod_api(&self) -> Api<Pod> {
        Api::namespaced(self.fake.client.clone(), NS)
    }

    /// The caches catch up with the API server, as the watches eventually do.
    async fn sync(&mut self) {
        let ats = self
            .at_api()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let selector = ListParams::default().labels(&build::selector());
        let pods = self.pod_api().list(&selector).await.unwrap().items;
        self.set_caches(ats, pods);
    }

    /// Sets what the caches show, stale or not.
    fn set_caches(&mut self, ats: Vec<At>, pods: Vec<Pod>) {
        fill(&mut self.ats, ats);
        fill(&mut self.pods, pods);
    }

    fn cached(&self, name: &str) -> Arc<At> {
        self.ctx
            .ats
            .get(&ObjectRef::new(name).within(NS))
            .expect("the At is cached")
    }

    /// Reconciles `name` after the caches caught up.
    async fn reconcile(&mut self, name: &str) -> Action {
        self.sync().await;
        self.reconcile_cached(name).await
    }

    /// Reconciles `name` from the caches as they are.
    async fn reconcile_cached(&self, name: &str) -> Action {
        at::reconcile(self.cached(name), self.ctx.clone())
            .await
            .expect("reconcile succeeds")
    }

    async fn at(&self, name: &str) -> At {
        self.at_api().get(name).await.unwrap()
    }

    async fn pods(&self) -> Vec<Pod> {
        self.pod_api()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    fn clear(&self) {
        self.fake.clear();
    }

    /// The changes to objects other than Events.
    fn writes(&self) -> Vec<Request> {
        let requests = self.fake.requests();
        requests.into_iter().filter(Request::is_write).collect()
    }

    /// The objects read one by one (lists, such as `sync`'s, are not counted).
    fn reads(&self) -> usize {
        let requests = self.fake.requests();
        requests.iter().filter(|r| r.verb == "get").count()
    }

    /// The reasons of the Events published (created or counted again in a series).
    fn events(&self) -> Vec<String> {
        let requests = self.fake.requests();
        requests.into_iter().filter_map(|r| r.reason).collect()
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Sets the pod's status, as the kubelet does.
    async fn pod_status(&mut self, name: &str, status: Value) {
        self.pod_api()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap();
        self.clear();
    }

    /// The same API server contents with `pod` being deleted (carrying a deletionTimestamp, held by
    /// its finalizers), and a fresh operator.
    async fn deleting(&self, pod: &str) -> Harness {
        let mut objects = Vec::new();
        for at in self
            .at_api()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
        {
            objects.push(serde_json::to_value(at).unwrap());
        }
        for mut p in self.pods().await {
            if p.name_any() == pod {
                p.metadata.deletion_timestamp = Some(Time("2030-01-01T00:00:42Z".parse().unwrap()));
            }
            objects.push(serde_json::to_value(p).unwrap());
        }
        let harness = Harness::new(objects).await;
        harness.clock.set(self.clock.now());
        harness
    }
}

fn at_value(name: &str, schedule: &str) -> Value {
    let mut at = At::new(
        name,
        AtSpec {
            schedule: schedule.into(),
            command: "echo YAY".into(),
            image: None,
        },
    );
    at.metadata.namespace = Some(NS.into());
    serde_json::to_value(at).unwrap()
}

fn time(s: &str) -> Time {
    Time(s.parse().unwrap())
}

fn finished(phase: &str, exit_code: i32) -> Value {
    json!({
        "phase": phase,
        "containerStatuses": [{
            "name": "busybox", "image": build::DEFAULT_IMAGE, "imageID": "", "ready": false,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "finishedAt": "2030-01-01T00:00:09Z"}}
        }]
    })
}

fn ready_reason(at: &At) -> String {
    let conditions = &at.status.as_ref().unwrap().conditions;
    cdn_operator::reconcile::conditions::find(conditions, status::READY)
        .unwrap()
        .reason
        .to_string()
}

/// Runs `name` (schedule in the past) to RUNNING with its pod created and the caches synced.
async fn running(name: &str) -> Harness {
    let mut h = Harness::with_at(name, PAST).await;
    h.reconcile(name).await;
    h.sync().await;
    h.clear();
    h
}

#[tokio::test]
async fn a_past_schedule_runs_at_once_in_one_pod() {
    let mut h = Harness::with_at("example-at", PAST).await;
    let action = h.reconcile("example-at").await;
    assert_eq!(action, Action::await_change());

    let at = h.at("example-at").await;
    let status = at.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(status.pod_name.as_deref(), Some("example-at-pod"));
    assert_eq!(status.start_time, Some(time(NOW)));
    assert_eq!(status.observed_generation, at.metadata.generation);

    let pods = h.pods().await;
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(pod.name_any(), "example-at-pod");
    assert_eq!(
        pod.labels().get("app").map(String::as_str),
        Some("example-at")
    );
    assert!(build::controlled_by(pod, at.metadata.uid.as_deref()));
    assert!(build::held(pod));
    let container = &pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        container.command.as_deref(),
        Some(&["/bin/sh".to_string(), "-c".into(), "echo YAY".into()][..])
    );
    assert_eq!(h.events(), ["Scheduled", "Started"]);

    // The intent (status RUNNING) was written before the pod was created.
    let order: Vec<_> = h
        .writes()
        .iter()
        .map(|r| (r.verb, r.name.clone()))
        .collect();
    assert_eq!(
        order,
        [
            ("patch_status", "example-at".to_string()),
            ("patch", "example-at-pod".to_string())
        ]
    );

    // Again and again: nothing more.
    h.clear();
    for _ in 0..3 {
        assert_eq!(h.reconcile("example-at").await, Action::await_change());
    }
    assert_eq!(h.pods().await.len(), 1);
    assert!(h.writes().is_empty(), "{:?}", h.writes());
    assert!(h.events().is_empty());
    assert_eq!(h.reads(), 0, "a steady state does not even read");
}

#[tokio::test]
async fn the_seed_example_runs_at_once() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/seed-examples/at-example.yaml"
    );
    let yaml = std::fs::read_to_string(path).expect("the seed examples beside the repository");
    let mut seed: Value = serde_yaml::from_str(&yaml).unwrap();
    seed["metadata"]["namespace"] = json!(NS);
    let _: At = serde_json::from_value(seed.clone()).expect("the seed is a valid At");
    let mut h = Harness::new(vec![seed]).await;
    h.reconcile("example-at").await;
    let at = h.at("example-at").await;
    assert_eq!(at.status.unwrap().phase, Some(Phase::Running));
    let pods = h.pods().await;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].name_any(), "example-at-pod");

    // `cdn-operator render` prints this very pod for the At as the cluster has it, but for what
    // the server and the apply bookkeeping add.
    let exported = cdn_operator::cli::manifests::Manifests {
        ats: vec![h.at("example-at").await],
        ..Default::default()
    };
    let rendered = cdn_operator::cli::render::render(
        &exported,
        &Default::default(),
        &Default::default(),
        cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
    )
    .expect("a valid At");
    let mut created = support::without_server_fields(&pods[0]);
    created.as_object_mut().unwrap().remove("status");
    let metadata = created["metadata"].as_object_mut().unwrap();
    let annotations = metadata.remove("annotations").unwrap_or_default();
    let keys: Vec<&String> = annotations
        .as_object()
        .into_iter()
        .flat_map(|a| a.keys())
        .collect();
    assert_eq!(
        keys,
        [cdn_operator::kubernetes::record::APPLIED_HASH_ANNOTATION]
    );
    assert_eq!(created, serde_json::to_value(&rendered.pods[0]).unwrap());
}

#[tokio::test]
async fn a_future_schedule_is_pending_and_wakes_exactly_when_due() {
    let mut h = Harness::with_at("later", "2030-01-01T00:10:00Z").await;
    let action = h.reconcile("later").await;
    assert_eq!(action, Action::requeue(Duration::from_secs(600)));
    let at = h.at("later").await;
    assert_eq!(at.status.as_ref().unwrap().phase, Some(Phase::Pending));
    assert_eq!(ready_reason(&at), status::PENDING);
    assert!(h.pods().await.is_empty());
    assert_eq!(h.events(), ["Scheduled"]);

    // An offset: the same instant, written differently, wakes at the same time.
    let mut other = Harness::with_at("later", "2030-01-01T01:10:00+01:00").await;
    assert_eq!(
        other.reconcile("later").await,
        Action::requeue(Duration::from_secs(600))
    );

    // Woken early (another trigger): no write, a shorter sleep.
    h.clear();
    h.advance(Duration::from_millis(599_250));
    assert_eq!(
        h.reconcile("later").await,
        Action::requeue(Duration::from_millis(750))
    );
    assert!(h.writes().is_empty());
    assert_eq!(h.reads(), 0);

    // Due.
    h.advance(Duration::from_millis(750));
    assert_eq!(h.reconcile("later").await, Action::await_change());
    assert_eq!(
        h.at("later").await.status.unwrap().phase,
        Some(Phase::Running)
    );
    assert_eq!(h.pods().await.len(), 1);
    assert_eq!(h.events(), ["Started"]);
}

#[tokio::test]
async fn status_goes_through_the_status_subresource() {
    let mut h = Harness::with_at("s", "2030-01-01T00:10:00Z").await;
    h.reconcile("s").await;
    let writes = h.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        (writes[0].verb, writes[0].name.as_str()),
        ("patch_status", "s")
    );
    let at = h.at("s").await;
    assert_eq!(at.spec.schedule, "2030-01-01T00:10:00Z");
    assert_eq!(at.metadata.generation, Some(1), "the spec was not written");
}

#[tokio::test]
async fn a_pod_that_succeeded_makes_the_at_done_and_is_released() {
    let mut h = running("ok").await;
    h.pod_status("ok-pod", finished("Succeeded", 0)).await;
    h.reconcile("ok").await;

    let status = h.at("ok").await.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Done));
    assert_eq!(status.outcome, Some(Outcome::Succeeded));
    assert_eq!(status.exit_code, Some(0));
    assert_eq!(status.completion_time, Some(time("2030-01-01T00:00:09Z")));
    assert_eq!(h.events(), ["Succeeded"]);
    // DONE first, then the finalizer released; the pod stays for its logs.
    let order: Vec<_> = h.writes().iter().map(|r| r.verb).collect();
    assert_eq!(order, ["patch_status", "patch"]);
    let pods = h.pods().await;
    assert_eq!(pods.len(), 1);
    assert!(!build::held(&pods[0]));

    h.clear();
    h.reconcile("ok").await;
    assert!(h.writes().is_empty(), "{:?}", h.writes());
    assert!(h.events().is_empty());
}

#[tokio::test]
async fn a_failed_release_keeps_its_event_and_is_retried_with_backoff() {
    let mut h = running("retry").await;
    h.pod_status("retry-pod", finished("Succeeded", 0)).await;
    // The release is a merge patch, which names no kind.
    h.fake
        .refuse_next(1, "patch ? retry-pod", 409, "the pod changed");
    h.sync().await;
    let error = at::reconcile(h.cached("retry"), h.ctx.clone())
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("could not release the finalizer of Pod retry-pod: "),
        "the error names the step and the pod: {error}"
    );
    assert_eq!(
        reconcile::error_policy(h.cached("retry"), &error, h.ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    // DONE was written and told, the pod is still held.
    assert_eq!(h.at("retry").await.status.unwrap().phase, Some(Phase::Done));
    assert_eq!(h.events(), ["Succeeded"]);
    assert!(build::held(&h.pods().await[0]));

    h.clear();
    assert_eq!(h.reconcile("retry").await, Action::await_change());
    assert!(!build::held(&h.pods().await[0]));
    assert!(h.events().is_empty(), "told once");
    let writes: Vec<_> = h
        .writes()
        .iter()
        .map(|w| (w.verb, w.name.clone()))
        .collect();
    assert_eq!(writes, [("patch", "retry-pod".to_string())]);
}

#[tokio::test]
async fn a_pod_that_failed_makes_the_at_done_and_failed_with_the_exit_code() {
    let mut h = running("ko").await;
    h.pod_status("ko-pod", finished("Failed", 3)).await;
    h.reconcile("ko").await;

    let at = h.at("ko").await;
    let status = at.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Done));
    assert_eq!(status.outcome, Some(Outcome::Failed));
    assert_eq!(status.exit_code, Some(3));
    assert_eq!(status.message.as_deref(), Some("The command exited 3"));
    assert_eq!(ready_reason(&at), status::FAILED);
    assert_eq!(h.events(), ["Failed"]);
    assert_eq!(h.pods().await.len(), 1, "never restarted, never re-created");
}

#[tokio::test]
async fn a_pod_deleted_while_running_makes_the_at_done_and_is_never_recreated() {
    let before = running("gone").await;
    let running_at = before.at("gone").await;
    // Someone deletes the pod: its finalizer holds it, with a deletionTimestamp.
    let mut h = before.deleting("gone-pod").await;
    h.reconcile("gone").await;

    let at = h.at("gone").await;
    let status = at.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Done));
    assert_eq!(status.outcome, Some(Outcome::Failed));
    assert_eq!(ready_reason(&at), status::POD_DELETED);
    assert_eq!(
        status.message.as_deref(),
        Some("Pod gone-pod was deleted before the command finished")
    );
    assert_eq!(status.completion_time, Some(time("2030-01-01T00:00:42Z")));
    assert_eq!(h.events(), ["PodDeleted"]);
    // The finalizer released, the pod is gone.
    assert!(h.pods().await.is_empty());

    // The pod's deletion reaches the operator before its own DONE does: the At cache still says
    // RUNNING and no pod. The fresh read prevents a second run.
    h.clear();
    h.set_caches(vec![running_at.clone()], vec![]);
    h.reconcile_cached("gone").await;
    assert!(h.pods().await.is_empty(), "no second pod");
    assert!(h.writes().is_empty(), "{:?}", h.writes());

    // And with everything caught up, still nothing.
    for _ in 0..3 {
        h.reconcile("gone").await;
    }
    assert!(h.pods().await.is_empty());
    assert!(h.writes().is_empty(), "{:?}", h.writes());
}

#[tokio::test]
async fn a_stale_held_pod_in_the_cache_is_not_brought_back() {
    // DONE and released, but the pod cache still shows the deleted pod with the finalizer.
    let before = running("stale").await;
    let mut h = before.deleting("stale-pod").await;
    let held_pod = h.pods().await.remove(0);
    h.reconcile("stale").await;
    assert!(h.pods().await.is_empty());

    h.clear();
    let done = h.at("stale").await;
    h.set_caches(vec![done], vec![held_pod]);
    // The release is a patch, which cannot create: the pod stays gone.
    h.reconcile_cached("stale").await;
    assert!(h.pods().await.is_empty());
    assert!(
        h.writes().iter().all(|w| w.kind != "Pod"),
        "{:?}",
        h.writes()
    );
}

#[tokio::test]
async fn a_reconcile_after_the_pod_was_created_but_before_its_status_still_gives_one_pod() {
    // The pod exists (created by an earlier run of the operator) but the At has no status.
    let mut seed = Harness::with_at("twice", PAST).await;
    seed.reconcile("twice").await;
    let pod = seed.pods().await.remove(0);
    let mut at = seed.at("twice").await;
    at.status = None;
    let uid = pod.uid();

    for pod_cached in [true, false] {
        let mut h = Harness::new(vec![
            serde_json::to_value(&at).unwrap(),
            serde_json::to_value(&pod).unwrap(),
        ])
        .await;
        if !pod_cached {
            // And the pod cache has not seen it yet.
            h.set_caches(vec![at.clone()], vec![]);
        }
        h.reconcile_cached("twice").await;
        let pods = h.pods().await;
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].uid(), uid, "the same pod");
        assert_eq!(
            h.at("twice").await.status.unwrap().phase,
            Some(Phase::Running)
        );
        let pod_writes = h.writes().iter().filter(|w| w.name == "twice-pod").count();
        assert_eq!(pod_writes, usize::from(!pod_cached), "{:?}", h.writes());
    }
}

#[tokio::test]
async fn racing_reconciles_create_one_pod() {
    let h = Harness::with_at("race", PAST).await;
    let (a, b) = futures::join!(
        at::reconcile(h.cached("race"), h.ctx.clone()),
        at::reconcile(h.cached("race"), h.ctx.clone())
    );
    // One of them may fail (and retry); neither creates a second pod.
    assert!(a.is_ok() || b.is_ok());
    let pods = h.pods().await;
    assert_eq!(pods.len(), 1);
    assert_eq!(
        h.at("race").await.status.unwrap().phase,
        Some(Phase::Running)
    );
}

#[tokio::test]
async fn a_bad_schedule_is_a_condition_and_one_event_then_waits_for_a_change() {
    let mut h = Harness::with_at("bad", "next tuesday").await;
    assert_eq!(h.reconcile("bad").await, Action::await_change());
    let at = h.at("bad").await;
    let status = at.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Pending));
    let scheduled =
        cdn_operator::reconcile::conditions::find(&status.conditions, status::SCHEDULED).unwrap();
    assert_eq!(scheduled.status, "False");
    assert_eq!(scheduled.reason, "InvalidSchedule");
    assert!(
        scheduled.message.contains("\"next tuesday\""),
        "{}",
        scheduled.message
    );
    assert_eq!(h.events(), ["InvalidSchedule"]);
    assert!(h.pods().await.is_empty());

    h.clear();
    for _ in 0..5 {
        assert_eq!(h.reconcile("bad").await, Action::await_change());
    }
    assert!(h.events().is_empty(), "one Event, not one per reconcile");
    assert!(h.writes().is_empty());

    // Fixed by an edit: scheduled.
    h.at_api()
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"schedule": "2030-01-01T00:00:30Z"}})),
        )
        .await
        .unwrap();
    h.clear();
    assert_eq!(
        h.reconcile("bad").await,
        Action::requeue(Duration::from_secs(30))
    );
    assert_eq!(h.events(), ["Scheduled"]);
}

#[tokio::test]
async fn an_edited_done_at_is_not_rerun() {
    let mut h = running("once").await;
    h.pod_status("once-pod", finished("Succeeded", 0)).await;
    h.reconcile("once").await;
    h.pod_api()
        .delete("once-pod", &Default::default())
        .await
        .unwrap();
    h.at_api()
        .patch(
            "once",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"command": "echo AGAIN", "schedule": PAST}})),
        )
        .await
        .unwrap();
    h.clear();
    h.reconcile("once").await;
    assert!(h.pods().await.is_empty(), "not rerun");
    let at = h.at("once").await;
    let status = at.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Done));
    assert_eq!(status.observed_generation, at.metadata.generation);
    assert_eq!(h.events(), ["NotRerun"]);
}

#[tokio::test]
async fn the_janitor_releases_the_pod_of_a_deleted_at_only() {
    let before = running("orphan").await;
    let h = before.deleting("orphan-pod").await;
    let pod = Arc::new(h.pods().await.remove(0));

    // The At still exists: its own reconcile decides.
    at::release_orphan(pod.clone(), h.ctx.clone())
        .await
        .unwrap();
    assert_eq!(h.pods().await.len(), 1);
    assert!(h.writes().is_empty());

    // The At was deleted: only its pod is left, being deleted, held by the finalizer.
    let h = Harness::new(vec![serde_json::to_value(&*pod).unwrap()]).await;
    at::release_orphan(pod, h.ctx.clone()).await.unwrap();
    assert!(h.pods().await.is_empty(), "released, so deleted");
}

#[tokio::test]
async fn a_pod_name_taken_by_another_pod_is_waited_for() {
    // The pod of an earlier At of the same name, still there.
    let mut old = Harness::with_at("reused", PAST).await;
    old.reconcile("reused").await;
    let mut stale_pod = old.pods().await.remove(0);
    stale_pod.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-of-an-older-at".into();
    let at = serde_json::to_value(old.at("reused").await).unwrap();
    let mut at: At = serde_json::from_value(at).unwrap();
    at.status = None;

    let mut h = Harness::new(vec![
        serde_json::to_value(&at).unwrap(),
        serde_json::to_value(&stale_pod).unwrap(),
    ])
    .await;
    assert_eq!(h.reconcile("reused").await, Action::await_change());
    let at = h.at("reused").await;
    assert_eq!(at.status.as_ref().unwrap().phase, Some(Phase::Pending));
    assert_eq!(ready_reason(&at), status::POD_NAME_TAKEN);
    assert_eq!(h.pods().await[0].uid(), stale_pod.uid(), "left alone");

    // Once it is gone, the At runs.
    h.pod_api()
        .delete("reused-pod", &Default::default())
        .await
        .unwrap();
    h.reconcile("reused").await;
    let pods = h.pods().await;
    assert_eq!(pods.len(), 1);
    assert!(build::controlled_by(&pods[0], at.metadata.uid.as_deref()));
}

#[test]
fn a_pod_event_reconciles_its_at() {
    let mut at: At = serde_json::from_value(at_value("x", PAST)).unwrap();
    at.metadata.uid = Some("uid-x".into());
    let pod = build::pod(&at, &Default::default(), build::DEFAULT_IMAGE);
    assert_eq!(at::owners(pod.clone()), [ObjectRef::new("x").within(NS)]);
    let mut unlabelled = pod;
    unlabelled.metadata.labels = None;
    assert_eq!(at::owners(unlabelled), [ObjectRef::new("x").within(NS)]);
}

#[test]
fn the_at_crd_has_its_columns_status_subresource_and_name_rule() {
    let crd = cdn_operator::api::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "At")
        .expect("cdn-operator crd prints the At CRD");
    assert_eq!(crd.spec.group, "cnat.programming-kubernetes.info");
    assert_eq!(crd.spec.names.plural, "ats");
    assert_eq!(crd.spec.scope, "Namespaced");
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<String> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.to_uppercase())
        .collect();
    assert_eq!(columns, ["SCHEDULE", "PHASE", "OUTCOME", "AGE"]);
    let schema = version
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap();
    let rules = schema.x_kubernetes_validations.as_ref().unwrap();
    assert!(rules
        .iter()
        .any(|r| r.rule == "self.metadata.name.size() <= 63"));
}

/// Uninstall (`cdn-operator release-finalizers`): every At pod of the scope that the operator's
/// finalizer holds is released, whatever its At's phase and whether its At still exists; other
/// finalizers and other pods are left alone; a pod that changed under it is released on the next
/// list; a second run writes nothing.
#[tokio::test]
async fn uninstall_releases_every_held_at_pod_of_the_scope_and_nothing_else() {
    use cdn_operator::at::uninstall;
    use cdn_operator::kubernetes::cache::Scope;

    let before = running("busy").await;
    let at = serde_json::to_value(before.at("busy").await).unwrap();
    let mut busy = before.pods().await.remove(0);
    busy.finalizers_mut().push("example.com/other".into());
    // The pod of an At deleted while no operator ran: being deleted, held.
    let mut orphan = busy.clone();
    orphan.metadata.name = Some("gone-pod".into());
    orphan.metadata.finalizers = Some(vec![build::FINALIZER.into()]);
    orphan.metadata.deletion_timestamp = Some(time("2030-01-01T00:00:42Z"));
    // Someone else's pod with the same finalizer name: not an At pod (no labels), left alone.
    let mut stranger = busy.clone();
    stranger.metadata.name = Some("stranger".into());
    stranger.metadata.labels = None;
    // An At pod of another namespace.
    let mut elsewhere = busy.clone();
    elsewhere.metadata.namespace = Some("elsewhere".into());
    let mut h = Harness::new(vec![
        at,
        serde_json::to_value(&busy).unwrap(),
        serde_json::to_value(&orphan).unwrap(),
        serde_json::to_value(&stranger).unwrap(),
        serde_json::to_value(&elsewhere).unwrap(),
    ])
    .await;
    h.clear();
    // The first patch finds the pod changed since the list (as a kubelet's status update does).
    h.fake
        .refuse_next(1, "patch ? busy-pod", 409, "the pod changed");

    let client = h.fake.client.clone();
    let mut released = uninstall::release_all(&client, &Scope::Namespace(NS.into()))
        .await
        .expect("released");
    released.sort();
    assert_eq!(released, ["default/busy-pod", "default/gone-pod"]);
    let pods = h.pods().await;
    let finalizers = |name: &str| {
        pods.iter()
            .find(|p| p.name_any() == name)
            .map(|p| p.finalizers().to_vec())
    };
    assert_eq!(
        finalizers("busy-pod"),
        Some(vec!["example.com/other".to_string()])
    );
    assert_eq!(finalizers("gone-pod"), None, "released, so deleted");
    assert_eq!(
        finalizers("stranger"),
        Some(vec![build::FINALIZER.into(), "example.com/other".into()])
    );
    let other_ns: Api<Pod> = Api::namespaced(client.clone(), "elsewhere");
    assert!(build::held(&other_ns.get("busy-pod").await.unwrap()));
    // The At is not touched: only pods are written.
    let writes: Vec<_> = h
        .writes()
        .iter()
        .map(|w| (w.verb, w.name.clone()))
        .collect();
    assert_eq!(
        writes.len(),
        3,
        "busy-pod twice (a conflict), gone-pod: {writes:?}"
    );
    assert!(writes.iter().all(|(verb, _)| *verb == "patch"));

    h.clear();
    let again = uninstall::release_all(&client, &Scope::Namespace(NS.into()))
        .await
        .unwrap();
    assert!(again.is_empty() && h.writes().is_empty(), "nothing left");

    let everywhere = uninstall::release_all(&client, &Scope::All).await.unwrap();
    assert_eq!(everywhere, ["elsewhere/busy-pod"]);
    assert!(!build::held(&other_ns.get("busy-pod").await.unwrap()));
    h.sync().await;
}

#[tokio::test]
async fn uninstall_fails_clearly_when_the_pods_cannot_be_released() {
    use cdn_operator::at::uninstall;
    use cdn_operator::kubernetes::cache::Scope;

    let h = running("denied").await;
    h.fake.refuse(
        "patch ? denied-pod",
        403,
        "pods \"denied-pod\" is forbidden",
    );
    let error = uninstall::release_all(&h.fake.client, &Scope::Namespace(NS.into()))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "could not release the finalizer of Pod default/denied-pod: pods \"denied-pod\" is forbidden (403 Forbidden)"
    );
    h.fake.accept();
    h.fake.refuse("patch ? denied-pod", 409, "the pod changed");
    let error = uninstall::release_all(&h.fake.client, &Scope::Namespace(NS.into()))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("still changed after 5 rounds"),
        "{error}"
    );
    assert!(build::held(&h.pods().await[0]), "nothing lost");
}

/// The status of the pod captured on a v1.36.2 node as `file` (`tests/fixtures/real-node/`).
fn real_node_pod_status(file: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/real-node/{file}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let pod: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    pod["status"].clone()
}

/// A pod that cannot start, as a real kubelet reports it: the At's Ready says why, with one
/// Warning per distinct problem; the same world writes and tells nothing.
#[tokio::test]
async fn a_pod_that_cannot_start_is_the_ats_reason_with_one_warning() {
    let mut h = running("at-nopull").await;
    h.pod_status("at-nopull-pod", real_node_pod_status("pod-at-nopull"))
        .await;
    h.reconcile("at-nopull").await;
    let at = h.at("at-nopull").await;
    assert_eq!(ready_reason(&at), "ImagePullBackOff");
    assert_eq!(at.status.as_ref().unwrap().phase, Some(Phase::Running));
    assert_eq!(h.events(), ["ImagePullBackOff"]);
    assert_eq!(h.writes().len(), 1, "the status: {:?}", h.writes());
    h.clear();
    h.reconcile("at-nopull").await;
    assert_eq!((h.writes().len(), h.events().len()), (0, 0));

    // The kubelet refuses the container (runAsNonRoot and a root image), as it said of nginx's.
    let mut refused = real_node_pod_status("pod-rootimage");
    refused["containerStatuses"][0]["name"] = json!(build::CONTAINER);
    refused["initContainerStatuses"] = Value::Null;
    h.pod_status("at-nopull-pod", refused).await;
    h.reconcile("at-nopull").await;
    let at = h.at("at-nopull").await;
    assert_eq!(ready_reason(&at), "CreateContainerConfigError");
    let ready = cdn_operator::reconcile::conditions::find(
        &at.status.as_ref().unwrap().conditions,
        status::READY,
    )
    .unwrap();
    assert_eq!(
        ready.message.as_str(),
        "Pod at-nopull-pod: container busybox cannot start: container has runAsNonRoot and image will run as root"
    );
    assert_eq!(h.events(), ["CreateContainerConfigError"]);
}
