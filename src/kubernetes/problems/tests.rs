//! On pods and Deployments as a v1.36.2 API server and kubelet wrote them
//! (`tests/fixtures/real-node/`, made by `e2e/capture-real-node-fixtures.sh`).

use super::*;
use k8s_openapi::api::core::v1::ContainerState;

fn pod(name: &str) -> Pod {
    let path = format!(
        "{}/tests/fixtures/real-node/pod-{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn deployment(name: &str) -> Deployment {
    let path = format!(
        "{}/tests/fixtures/real-node/deployment-{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn problem_of(name: &str) -> Option<Problem> {
    of_pod(pod(name).status.as_ref().unwrap())
}

#[test]
fn a_crash_loop_says_nginx_last_error_line_when_the_kubelet_kept_it() {
    let p = problem_of("crash-logs").unwrap();
    assert_eq!(p.reason, CRASH_LOOP_BACK_OFF);
    assert_eq!(
        p.message,
        "container nginx exits with code 127: /etc/nginx/cdn/run.sh: line 28: cksum: not found"
    );
}

#[test]
fn a_crash_loop_without_the_logs_says_the_exit_code() {
    let p = problem_of("crash").unwrap();
    assert_eq!(
        (p.reason, p.message.as_str()),
        (CRASH_LOOP_BACK_OFF, "container nginx exits with code 127")
    );
}

#[test]
fn an_image_that_cannot_be_pulled_is_named() {
    let p = problem_of("nopull").unwrap();
    assert_eq!(
        (p.reason, p.message.as_str()),
        (
            IMAGE_PULL_BACK_OFF,
            "image localhost/does-not-exist:1.30 of container nginx cannot be pulled"
        )
    );
    let at = problem_of("at-nopull").unwrap();
    assert_eq!(
        at.message,
        "image localhost/does-not-exist:1 of container busybox cannot be pulled"
    );
}

#[test]
fn a_container_the_kubelet_refuses_has_its_words_without_the_pod() {
    let p = problem_of("rootimage").unwrap();
    assert_eq!(
        (p.reason, p.message.as_str()),
        (
            CREATE_CONTAINER_CONFIG_ERROR,
            "container nginx cannot start: container has runAsNonRoot and image will run as root"
        )
    );
}

#[test]
fn an_unschedulable_pod_has_the_schedulers_first_sentence() {
    let p = problem_of("unschedulable").unwrap();
    assert_eq!(
        (p.reason, p.message.as_str()),
        (
            UNSCHEDULABLE,
            "no node can run the pod: 0/1 nodes are available: 1 Insufficient cpu."
        )
    );
}

/// The kubelet rewrites a crash-looping pod's status at every attempt: back-off, restart count,
/// running between two crashes. The problem stays the same throughout, or each attempt would
/// cost a status write.
#[test]
fn a_crash_loop_is_the_same_problem_at_every_attempt() {
    let first = problem_of("crash-logs").unwrap();
    let mut pod = pod("crash-logs");
    let nginx = pod
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap();
    nginx[0].restart_count = 7;
    let waiting = nginx[0].state.as_mut().unwrap().waiting.as_mut().unwrap();
    waiting.message = Some("back-off 5m0s restarting failed container=nginx pod=x".into());
    assert_eq!(of_pod(pod.status.as_ref().unwrap()), Some(first.clone()));
    // Running again, not ready yet: the same loop.
    let nginx = &mut pod
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0];
    nginx.state = Some(ContainerState {
        running: Some(Default::default()),
        ..Default::default()
    });
    assert_eq!(of_pod(pod.status.as_ref().unwrap()), Some(first));
    // Ready: over.
    let nginx = &mut pod
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0];
    nginx.ready = true;
    assert_eq!(of_pod(pod.status.as_ref().unwrap()), None);
}

#[test]
fn a_pod_starting_has_no_problem() {
    let mut pod = pod("nopull");
    let nginx = &mut pod
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0];
    let waiting = nginx.state.as_mut().unwrap().waiting.as_mut().unwrap();
    waiting.reason = Some("ContainerCreating".into());
    assert_eq!(of_pod(pod.status.as_ref().unwrap()), None);
    assert_eq!(of_pod(&PodStatus::default()), None, "not scheduled yet");
}

#[test]
fn nginx_errors_lose_their_timestamp_and_process_ids() {
    let logs = "2026/11/27 01:58:26 [notice] 1#1: using the \"epoll\" event method\n\
        2026/11/27 01:58:26 [emerg] 1#1: host not found in upstream \"cache-a.cdnpod.svc:80\" in /etc/nginx/cdn/nginx.conf:12\n\
        2026/11/27 01:58:26 [notice] 1#1: exiting\n";
    let expected =
        "nginx: [emerg] host not found in upstream \"cache-a.cdnpod.svc:80\" in /etc/nginx/cdn/nginx.conf:12";
    assert_eq!(last_error_line(logs).as_deref(), Some(expected));
    let test = "nginx: [emerg] unknown directive \"prxy_pass\" in /etc/nginx/cdn/nginx.conf:3\n";
    assert_eq!(
        last_error_line(test).as_deref(),
        Some("nginx: [emerg] unknown directive \"prxy_pass\" in /etc/nginx/cdn/nginx.conf:3")
    );
    assert_eq!(last_error_line("\n \n"), None);
}

#[test]
fn a_long_message_is_cut() {
    let p = Problem::new(CRASH_LOOP_BACK_OFF, "é".repeat(MESSAGE_MAX + 10));
    assert_eq!(p.message.chars().count(), MESSAGE_MAX + 1);
    assert!(p.message.ends_with('…'));
}

#[test]
fn a_rollout_past_its_deadline_is_told_by_the_deployment() {
    assert!(deadline_exceeded(&deployment("crash")));
    assert!(!deadline_exceeded(&deployment("rootimage")));
}

#[test]
fn a_summary_keeps_the_problem_and_the_instance_only() {
    let served = pod("rootimage");
    let summary = PodSummary::of(&served);
    assert_eq!(summary.instance(), Some("rootimage"));
    assert_eq!(summary.problem, of_pod(served.status.as_ref().unwrap()));
    assert_eq!(summary.metadata.labels.as_ref().unwrap().len(), 1);
    assert_eq!(summary.metadata.managed_fields, None);
    assert_eq!(summary.metadata.owner_references, None);
    // Only whether a StatefulSet controls it is kept of its owners.
    assert!(!summary.stateful, "{:?}", served.metadata.owner_references);
    let mut owned = served.clone();
    owned.metadata.owner_references = Some(vec![serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "vod", "uid": "u",
        "controller": true,
    }))
    .unwrap()]);
    let stateful = PodSummary::of(&owned);
    assert!(stateful.stateful && stateful.metadata.owner_references.is_none());
    let mut leaving = served.clone();
    leaving.metadata.deletion_timestamp = served.metadata.creation_timestamp.clone();
    let leaving = PodSummary::of(&leaving);
    assert!(leaving.leaving && leaving.problem.is_some());
    assert_eq!(
        leaving.counted(),
        None,
        "a pod being deleted no longer counts"
    );
    let problems = PodProblems::default();
    problems.fill([summary]);
    assert!(
        problems.writer().apply(&leaving),
        "its deletion began: a change"
    );
    assert_eq!(problems.worst("fail41", "rootimage"), None);
}

#[test]
fn the_cache_keeps_only_pods_with_a_problem_and_tells_when_one_changes() {
    let problems = PodProblems::default();
    let mut writer = problems.writer();
    problems.fill([PodSummary::of(&pod("crash"))]);
    assert_eq!(
        problems.worst("fail41", "crash").map(|p| p.reason),
        Some(CRASH_LOOP_BACK_OFF)
    );
    // The same problem again (a new attempt): nothing changed.
    assert!(!writer.apply(&PodSummary::of(&pod("crash"))));
    // A second pod of the cluster, whose image cannot be pulled: the crash is more telling.
    let mut other = pod("nopull");
    other.metadata.name = Some("crash-deployment-2".into());
    other
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(INSTANCE_LABEL.into(), "crash".into());
    assert!(writer.apply(&PodSummary::of(&other)));
    assert_eq!(
        problems.worst("fail41", "crash").map(|p| p.reason),
        Some(CRASH_LOOP_BACK_OFF)
    );
    // The crashing pod recovers: the other one's problem shows.
    let mut ready = pod("crash");
    let nginx = &mut ready
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0];
    nginx.ready = true;
    nginx.state = Some(ContainerState {
        running: Some(Default::default()),
        ..Default::default()
    });
    assert!(writer.apply(&PodSummary::of(&ready)));
    assert_eq!(
        problems.worst("fail41", "crash").map(|p| p.reason),
        Some(IMAGE_PULL_BACK_OFF)
    );
    assert!(!writer.apply(&PodSummary::of(&ready)), "still fine");
    writer.delete(&PodSummary::of(&other));
    assert_eq!(problems.worst("fail41", "crash"), None);
    assert!(problems.is_empty(), "pods that run cost nothing");
    assert_eq!(problems.worst("other", "crash"), None);
}

/// The compact cache of Deployments keeps the deadline, and gives it back to the status step.
#[test]
fn a_cached_deployment_keeps_its_deadline_and_nothing_else_of_its_conditions() {
    use crate::kubernetes::compact::Compact;
    let exceeded = Compact::of(&deployment("crash")).record;
    assert!(exceeded.rollout.as_ref().unwrap().deadline_exceeded);
    assert!(deadline_exceeded(
        &exceeded.typed::<Deployment>("crash-deployment").unwrap()
    ));
    let progressing = Compact::of(&deployment("rootimage")).record;
    assert!(!progressing.rollout.as_ref().unwrap().deadline_exceeded);
    let typed: Deployment = progressing.typed("rootimage-deployment").unwrap();
    assert!(!deadline_exceeded(&typed));
    assert_eq!(
        typed.status.unwrap().conditions,
        None,
        "no other condition is kept"
    );
    assert!(
        !exceeded.same_but_version(&progressing),
        "a deadline passed is a change: it reconciles the cluster"
    );
}
