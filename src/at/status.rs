//! What an At should become, given its pod and the time: its status, what to do to its pod, when
//! to look again, and the Events the change deserves. Pure.
//!
//! The phases only move forward: PENDING → RUNNING → DONE. RUNNING is written before the pod is
//! created (the intent is recorded first), DONE before the pod's finalizer is released.

use super::build::{self, held, pod_name, CONTAINER};
use super::schedule;
use crate::api::{At, AtStatus, Outcome, Phase};
use crate::kubernetes::problems;
use crate::reconcile::conditions::{find, set_condition, ConditionStatus};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::time::Duration;

/// True once the At is DONE, whatever the outcome (see `status.outcome`).
pub const READY: &str = "Ready";
/// True when the schedule is a valid time; False (reason InvalidSchedule) when it is not.
pub const SCHEDULED: &str = "Scheduled";

/// Ready reasons.
pub const PENDING: &str = "Pending";
pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
pub const RUNNING: &str = "Running";
pub const SUCCEEDED: &str = "Succeeded";
pub const FAILED: &str = "Failed";
pub const POD_DELETED: &str = "PodDeleted";
pub const POD_NAME_TAKEN: &str = "PodNameTaken";

/// The At's pod, as the cache shows it.
#[derive(Clone, Copy, Debug)]
pub enum PodView<'a> {
    /// No pod of that name.
    Absent,
    /// The pod, controlled by this At.
    Ours(&'a Pod),
    /// A pod of that name that this At does not control (say, the pod of a deleted At of the
    /// same name, on its way out).
    Foreign,
}

/// Sorts the cached pod named after `at`.
pub fn view<'a>(at: &At, pod: Option<&'a Pod>) -> PodView<'a> {
    match pod {
        None => PodView::Absent,
        Some(pod) if build::controlled_by(pod, at.metadata.uid.as_deref()) => PodView::Ours(pod),
        Some(_) => PodView::Foreign,
    }
}

/// What to do to the pod, after the status is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodAction {
    Nothing,
    /// Apply the pod: the At is RUNNING and no pod is in the cache, so it was not created yet (its
    /// finalizer guarantees that a created pod cannot vanish unseen). The deterministic name and
    /// server-side apply make a repeated creation a no-op.
    Create,
    /// Remove the finalizer: the At is DONE, the pod may go.
    Release,
}

pub use crate::kubernetes::events::Notice;

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub status: AtStatus,
    pub pod: PodAction,
    /// When to look again if nothing changes; `None`: only on a change.
    pub wake: Option<Duration>,
    pub notices: Vec<Notice>,
}

impl Plan {
    /// Whether carrying the plan out writes anything (Events aside).
    pub fn writes(&self, at: &At) -> bool {
        at.status.as_ref() != Some(&self.status) || self.pod != PodAction::Nothing
    }
}

/// The plan for `at`, whose pod is `pod`, at `now`. An unchanged world gives an identical status
/// (conditions keep their lastTransitionTime, times come from the pod or the previous status),
/// so a repeated reconcile writes nothing.
pub fn plan(at: &At, pod: PodView<'_>, now: Timestamp) -> Plan {
    let previous = at.status.clone().unwrap_or_default();
    let mut status = AtStatus {
        observed_generation: at.metadata.generation,
        ..previous.clone()
    };
    // The API keeps seconds: a finer time would never compare equal to what was written.
    let stamp = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
    let mut next = Next {
        at,
        status: &mut status,
        stamp: &stamp,
    };
    let mut action = PodAction::Nothing;
    let mut wake = None;
    use ConditionStatus::{False, True};
    match previous.phase {
        // Never rerun, whatever the edit: only let the pod go.
        Some(Phase::Done) => {
            if matches!(pod, PodView::Ours(p) if held(p)) {
                action = PodAction::Release;
            }
        }
        Some(Phase::Running) => action = next.run(pod),
        None | Some(Phase::Pending) => match schedule::parse(&at.spec.schedule) {
            Err(message) => {
                next.status.phase = Some(Phase::Pending);
                next.set(SCHEDULED, False, INVALID_SCHEDULE, message.clone());
                next.set(READY, False, INVALID_SCHEDULE, message);
            }
            Ok(time) => {
                next.set(
                    SCHEDULED,
                    True,
                    "Scheduled",
                    format!("The command runs at {time}"),
                );
                match (schedule::remaining(time, now), pod) {
                    (Some(left), _) => {
                        next.status.phase = Some(Phase::Pending);
                        next.set(READY, False, PENDING, format!("Waiting until {time}"));
                        wake = Some(left);
                    }
                    // Due, but the name is taken: wait for that pod to go (its deletion triggers
                    // a reconcile) before recording the intent to run.
                    (None, PodView::Foreign) => {
                        next.status.phase = Some(Phase::Pending);
                        next.set(READY, False, POD_NAME_TAKEN, name_taken(at));
                    }
                    (None, pod) => action = next.run(pod),
                }
            }
        },
    }
    let notices = notices(at, &previous, &status);
    Plan {
        status,
        pod: action,
        wake,
        notices,
    }
}

struct Next<'a> {
    at: &'a At,
    status: &'a mut AtStatus,
    stamp: &'a Time,
}

impl Next<'_> {
    fn set(&mut self, type_: &str, status: ConditionStatus, reason: &str, message: String) {
        set_condition(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.at.metadata.generation,
            self.stamp,
        );
    }

    /// RUNNING: the pod runs, or is about to be created, or has ended (→ DONE).
    fn run(&mut self, pod: PodView<'_>) -> PodAction {
        use ConditionStatus::{False, True};
        let name = self
            .status
            .pod_name
            .get_or_insert_with(|| pod_name(&self.at.name_any()))
            .clone();
        self.status.phase = Some(Phase::Running);
        if self.status.start_time.is_none() {
            self.status.start_time = Some(self.stamp.clone());
        }
        let pod = match pod {
            PodView::Absent => {
                self.set(READY, False, RUNNING, running(&name, None));
                return PodAction::Create;
            }
            PodView::Foreign => {
                self.set(READY, False, POD_NAME_TAKEN, name_taken(self.at));
                return PodAction::Nothing;
            }
            PodView::Ours(pod) => pod,
        };
        let Some(end) = ended(pod, &name) else {
            match pod.status.as_ref().and_then(problems::of_pod) {
                Some(problem) => {
                    let message = format!("Pod {name}: {}", problem.message);
                    self.set(READY, False, problem.reason, message);
                }
                None => self.set(READY, False, RUNNING, running(&name, Some(pod))),
            }
            return PodAction::Nothing;
        };
        self.status.phase = Some(Phase::Done);
        self.status.outcome = Some(end.outcome);
        self.status.exit_code = end.exit_code;
        self.status.message = (end.outcome == Outcome::Failed).then(|| end.message.clone());
        self.status.completion_time = Some(end.time.unwrap_or_else(|| self.stamp.clone()));
        self.set(READY, True, end.reason, end.message);
        if held(pod) {
            PodAction::Release
        } else {
            PodAction::Nothing
        }
    }
}

fn name_taken(at: &At) -> String {
    format!(
        "Pod {} exists and does not belong to this At; waiting for it to be deleted",
        pod_name(&at.name_any())
    )
}

/// The Ready message while RUNNING and no problem is known ([`problems::of_pod`]). It only changes
/// when the container waits for another reason, so a pod going through its phases does not
/// rewrite the status each time.
fn running(name: &str, pod: Option<&Pod>) -> String {
    let waiting = pod
        .and_then(|p| container(p))
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .filter(|r| !matches!(*r, "ContainerCreating" | "PodInitializing"));
    match waiting {
        Some(reason) => format!("Pod {name} cannot start: {reason}"),
        None => format!("Pod {name} runs the command"),
    }
}

fn container(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .find(|c| c.name == CONTAINER)
        .or(statuses.first())
}

fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    container(pod)?.state.as_ref()?.terminated.as_ref()
}

/// How a pod ended, if it did.
struct End {
    outcome: Outcome,
    reason: &'static str,
    exit_code: Option<i32>,
    message: String,
    /// When: the container's end, else the pod's deletion; `None`: unknown, now.
    time: Option<Time>,
}

fn ended(pod: &Pod, name: &str) -> Option<End> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let terminated = terminated(pod);
    let exit_code = terminated.map(|t| t.exit_code);
    let time = terminated
        .and_then(|t| t.finished_at.clone())
        .or_else(|| pod.metadata.deletion_timestamp.clone());
    let end = |outcome, reason, exit_code, message| End {
        outcome,
        reason,
        exit_code,
        message,
        time: time.clone(),
    };
    if phase == Some("Succeeded") {
        return Some(end(
            Outcome::Succeeded,
            SUCCEEDED,
            Some(exit_code.unwrap_or(0)),
            "The command exited 0".into(),
        ));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        let mut message = format!("Pod {name} was deleted before the command finished");
        if let Some(code) = exit_code {
            message.push_str(&format!(" (it exited {code})"));
        }
        return Some(end(Outcome::Failed, POD_DELETED, exit_code, message));
    }
    if phase != Some("Failed") {
        return None;
    }
    let message = match terminated {
        Some(t) => {
            let mut message = format!("The command exited {}", t.exit_code);
            if let Some(reason) = t.reason.as_deref().filter(|r| *r != "Error") {
                message.push_str(&format!(" ({reason})"));
            }
            message
        }
        None => {
            let status = pod.status.as_ref();
            let reason = status
                .and_then(|s| s.reason.as_deref())
                .unwrap_or("unknown reason");
            match status.and_then(|s| s.message.as_deref()) {
                Some(detail) => format!("Pod {name} failed: {reason}: {detail}"),
                None => format!("Pod {name} failed: {reason}"),
            }
        }
    };
    Some(end(Outcome::Failed, FAILED, exit_code, message))
}

/// The Events the change from `previous` to `next` deserves: one per transition, none when
/// nothing changed.
pub fn notices(at: &At, previous: &AtStatus, next: &AtStatus) -> Vec<Notice> {
    let mut out = Vec::new();
    let mut push = |warning, reason, message: String| {
        out.push(if warning {
            Notice::warning(reason, message)
        } else {
            Notice::normal(reason, message)
        })
    };
    let key = |s: &AtStatus, t: &str| {
        find(&s.conditions, t).map(|c| {
            let text = |t: &crate::api::Text| t.to_string();
            (text(&c.status), text(&c.reason), text(&c.message))
        })
    };

    if let Some((status, _, message)) = key(next, SCHEDULED) {
        if key(previous, SCHEDULED).map(|(s, _, m)| (s, m))
            != Some((status.clone(), message.clone()))
        {
            if status == "True" {
                push(false, "Scheduled", message);
            } else {
                push(true, INVALID_SCHEDULE, message);
            }
        }
    }

    let started = |phase: Option<Phase>| matches!(phase, Some(Phase::Running | Phase::Done));
    if !started(previous.phase) && started(next.phase) {
        let pod = next
            .pod_name
            .clone()
            .unwrap_or_else(|| pod_name(&at.name_any()));
        push(false, "Started", format!("Pod {pod} runs the command"));
    }

    let ready = key(next, READY);
    if let Some((_, reason, message)) = &ready {
        if next.phase == Some(Phase::Done) && previous.phase != Some(Phase::Done) {
            match reason.as_str() {
                SUCCEEDED => push(false, "Succeeded", message.clone()),
                POD_DELETED => push(true, "PodDeleted", message.clone()),
                _ => push(true, "Failed", message.clone()),
            }
        }
        if reason == POD_NAME_TAKEN
            && key(previous, READY).map(|(_, r, _)| r) != Some(reason.clone())
        {
            push(true, POD_NAME_TAKEN, message.clone());
        }
        // A pod that cannot start: one Warning per distinct problem, as for a CdnCluster.
        let cannot_start = problems::reason(reason).filter(|_| next.phase == Some(Phase::Running));
        if let Some(reason) = cannot_start {
            if key(previous, READY).map(|(_, r, m)| (r, m)) != ready.clone().map(|(_, r, m)| (r, m))
            {
                push(true, reason, message.clone());
            }
        }
    }

    if previous.phase == Some(Phase::Done)
        && previous.observed_generation.is_some()
        && previous.observed_generation != next.observed_generation
    {
        push(
            false,
            "NotRerun",
            "This At has already run; an edit does not run it again (create a new At instead)"
                .into(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AtSpec;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    const NOW: &str = "2030-01-01T00:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    fn at(schedule: &str) -> At {
        let mut at = At::new(
            "a",
            AtSpec {
                schedule: schedule.into(),
                command: "echo YAY".into(),
                image: None,
            },
        );
        at.metadata.namespace = Some("ns".into());
        at.metadata.uid = Some("uid-a".into());
        at.metadata.generation = Some(1);
        at
    }

    /// `at` after the plan's status was written.
    fn written(mut at: At, plan: &Plan) -> At {
        at.status = Some(plan.status.clone());
        at
    }

    fn pod(phase: &str, exit_code: Option<i32>) -> Pod {
        let mut pod = build::pod(&at(NOW), &Default::default(), build::DEFAULT_IMAGE);
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: exit_code.map(|code| {
                vec![ContainerStatus {
                    name: CONTAINER.into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: code,
                            finished_at: Some(Time("2030-01-01T00:00:07Z".parse().unwrap())),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        pod
    }

    fn reasons(plan: &Plan) -> Vec<&'static str> {
        plan.notices.iter().map(|n| n.reason).collect()
    }

    fn ready_reason(plan: &Plan) -> String {
        find(&plan.status.conditions, READY)
            .unwrap()
            .reason
            .to_string()
    }

    #[test]
    fn a_future_schedule_is_pending_and_wakes_exactly_when_due() {
        let plan = plan(&at("2030-01-01T00:10:00Z"), PodView::Absent, now());
        assert_eq!(plan.status.phase, Some(Phase::Pending));
        assert_eq!(plan.wake, Some(Duration::from_secs(600)));
        assert_eq!(plan.pod, PodAction::Nothing);
        assert_eq!(reasons(&plan), ["Scheduled"]);
        assert_eq!(plan.status.observed_generation, Some(1));
        assert!(crate::reconcile::conditions::is_true(
            &plan.status.conditions,
            SCHEDULED
        ));
    }

    #[test]
    fn a_pending_at_replanned_unchanged_writes_nothing_and_tells_nothing() {
        let first = plan(&at("2030-01-01T00:10:00Z"), PodView::Absent, now());
        let at = written(at("2030-01-01T00:10:00Z"), &first);
        let later = now() + jiff::SignedDuration::from_secs(60);
        let again = plan(&at, PodView::Absent, later);
        assert!(!again.writes(&at));
        assert!(again.notices.is_empty());
        assert_eq!(again.wake, Some(Duration::from_secs(540)));
    }

    #[test]
    fn a_due_schedule_records_running_before_the_pod_exists() {
        let plan = plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now());
        assert_eq!(plan.status.phase, Some(Phase::Running));
        assert_eq!(plan.status.pod_name.as_deref(), Some("a-pod"));
        assert_eq!(plan.status.start_time, Some(Time(now())));
        assert_eq!(plan.pod, PodAction::Create);
        assert_eq!(plan.wake, None);
        assert_eq!(reasons(&plan), ["Scheduled", "Started"]);
    }

    #[test]
    fn running_with_the_pod_created_writes_nothing_more() {
        let first = plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now());
        let at = written(at("2019-04-12T10:12:00Z"), &first);
        let running = pod("Running", None);
        let again = plan(
            &at,
            PodView::Ours(&running),
            now() + jiff::SignedDuration::from_secs(5),
        );
        assert_eq!(again.pod, PodAction::Nothing);
        assert!(!again.writes(&at), "{:?}", again.status);
        // Not in the cache yet: apply again (a no-op for the server if it exists).
        assert_eq!(plan(&at, PodView::Absent, now()).pod, PodAction::Create);
    }

    #[test]
    fn a_pod_already_there_while_pending_is_adopted_not_doubled() {
        // The status write was lost or the cache lags: the pod exists, the At says nothing.
        let running = pod("Running", None);
        let plan = plan(&at("2019-04-12T10:12:00Z"), PodView::Ours(&running), now());
        assert_eq!(plan.status.phase, Some(Phase::Running));
        assert_eq!(plan.pod, PodAction::Nothing);
    }

    #[test]
    fn succeeded_then_released() {
        let running = written(
            at("2019-04-12T10:12:00Z"),
            &plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now()),
        );
        let done = pod("Succeeded", Some(0));
        let plan = plan(&running, PodView::Ours(&done), now());
        assert_eq!(plan.status.phase, Some(Phase::Done));
        assert_eq!(plan.status.outcome, Some(Outcome::Succeeded));
        assert_eq!(plan.status.exit_code, Some(0));
        assert_eq!(plan.status.message, None);
        assert_eq!(
            plan.status.completion_time,
            Some(Time("2030-01-01T00:00:07Z".parse().unwrap()))
        );
        assert_eq!(plan.pod, PodAction::Release);
        assert_eq!(reasons(&plan), ["Succeeded"]);
        assert!(crate::reconcile::conditions::is_true(
            &plan.status.conditions,
            READY
        ));
    }

    #[test]
    fn failed_with_the_exit_code() {
        let running = written(
            at("2019-04-12T10:12:00Z"),
            &plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now()),
        );
        let failed = pod("Failed", Some(3));
        let plan = plan(&running, PodView::Ours(&failed), now());
        assert_eq!(plan.status.phase, Some(Phase::Done));
        assert_eq!(plan.status.outcome, Some(Outcome::Failed));
        assert_eq!(plan.status.exit_code, Some(3));
        assert_eq!(plan.status.message.as_deref(), Some("The command exited 3"));
        assert_eq!(ready_reason(&plan), FAILED);
        assert_eq!(reasons(&plan), ["Failed"]);
        assert!(plan.notices[0].warning);
    }

    #[test]
    fn a_pod_failed_without_running_tells_why() {
        let running = written(
            at("2019-04-12T10:12:00Z"),
            &plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now()),
        );
        let mut evicted = pod("Failed", None);
        let status = evicted.status.as_mut().unwrap();
        status.reason = Some("Evicted".into());
        status.message = Some("The node was low on resource: memory.".into());
        let plan = plan(&running, PodView::Ours(&evicted), now());
        assert_eq!(plan.status.exit_code, None);
        assert_eq!(
            plan.status.message.as_deref(),
            Some("Pod a-pod failed: Evicted: The node was low on resource: memory.")
        );
        assert_eq!(plan.status.completion_time, Some(Time(now())));
    }

    #[test]
    fn a_pod_deleted_before_it_finished_is_done_and_failed() {
        let running = written(
            at("2019-04-12T10:12:00Z"),
            &plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now()),
        );
        let mut deleted = pod("Running", None);
        deleted.metadata.deletion_timestamp = Some(Time("2030-01-01T00:00:03Z".parse().unwrap()));
        let plan = plan(&running, PodView::Ours(&deleted), now());
        assert_eq!(plan.status.phase, Some(Phase::Done));
        assert_eq!(plan.status.outcome, Some(Outcome::Failed));
        assert_eq!(ready_reason(&plan), POD_DELETED);
        assert_eq!(
            plan.status.message.as_deref(),
            Some("Pod a-pod was deleted before the command finished")
        );
        assert_eq!(
            plan.status.completion_time,
            Some(Time("2030-01-01T00:00:03Z".parse().unwrap()))
        );
        assert_eq!(plan.pod, PodAction::Release);
        assert_eq!(reasons(&plan), ["PodDeleted"]);
    }

    #[test]
    fn a_pod_that_succeeded_and_was_then_deleted_succeeded() {
        let running = written(
            at("2019-04-12T10:12:00Z"),
            &plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now()),
        );
        let mut done = pod("Succeeded", Some(0));
        done.metadata.deletion_timestamp = Some(Time(now()));
        let plan = plan(&running, PodView::Ours(&done), now());
        assert_eq!(plan.status.outcome, Some(Outcome::Succeeded));
    }

    #[test]
    fn done_is_never_rerun_even_when_edited() {
        let finished = pod("Succeeded", Some(0));
        let done = written(
            running_at(),
            &plan(&running_at(), PodView::Ours(&finished), now()),
        );
        // Edited: a new schedule and command, and the pod is gone.
        let mut edited = done.clone();
        edited.spec.schedule = "2019-04-13T10:12:00Z".into();
        edited.spec.command = "echo AGAIN".into();
        edited.metadata.generation = Some(2);
        let plan = plan(&edited, PodView::Absent, now());
        assert_eq!(plan.status.phase, Some(Phase::Done));
        assert_eq!(plan.pod, PodAction::Nothing);
        assert_eq!(plan.status.observed_generation, Some(2));
        assert_eq!(reasons(&plan), ["NotRerun"]);
        let again = written(edited, &plan);
        let unchanged = super::plan(&again, PodView::Absent, now());
        assert!(!unchanged.writes(&again));
        assert!(unchanged.notices.is_empty());
    }

    fn running_at() -> At {
        written(
            at("2019-04-12T10:12:00Z"),
            &plan(&at("2019-04-12T10:12:00Z"), PodView::Absent, now()),
        )
    }

    #[test]
    fn done_releases_a_held_pod_and_nothing_else() {
        let finished = pod("Succeeded", Some(0));
        let done = written(
            running_at(),
            &plan(&running_at(), PodView::Ours(&finished), now()),
        );
        assert_eq!(
            plan(&done, PodView::Ours(&finished), now()).pod,
            PodAction::Release
        );
        let mut released = finished.clone();
        released.metadata.finalizers = None;
        let settled = plan(&done, PodView::Ours(&released), now());
        assert_eq!(settled.pod, PodAction::Nothing);
        assert!(!settled.writes(&done));
    }

    #[test]
    fn a_bad_schedule_is_a_condition_and_one_notice_then_silence() {
        let bad = at("next tuesday");
        let first = plan(&bad, PodView::Absent, now());
        assert_eq!(first.status.phase, Some(Phase::Pending));
        assert_eq!(first.wake, None);
        assert_eq!(first.pod, PodAction::Nothing);
        let scheduled = find(&first.status.conditions, SCHEDULED).unwrap();
        assert_eq!(
            (scheduled.status.as_str(), scheduled.reason.as_str()),
            ("False", INVALID_SCHEDULE)
        );
        assert!(
            scheduled.message.contains("\"next tuesday\""),
            "{}",
            scheduled.message
        );
        assert_eq!(reasons(&first), [INVALID_SCHEDULE]);
        assert!(first.notices[0].message.contains("\"next tuesday\""));
        assert!(first.notices[0].warning);

        let seen = written(bad, &first);
        let again = plan(&seen, PodView::Absent, now());
        assert!(!again.writes(&seen));
        assert!(again.notices.is_empty());

        // Fixed: scheduled again.
        let mut fixed = seen.clone();
        fixed.spec.schedule = "2030-01-01T00:00:30Z".into();
        fixed.metadata.generation = Some(2);
        let plan = plan(&fixed, PodView::Absent, now());
        assert_eq!(plan.wake, Some(Duration::from_secs(30)));
        assert_eq!(reasons(&plan), ["Scheduled"]);
    }

    #[test]
    fn a_foreign_pod_of_the_same_name_is_waited_for() {
        let mut other = pod("Running", None);
        other.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cnat.programming-kubernetes.info/v1alpha1".into(),
            kind: "At".into(),
            name: "a".into(),
            uid: "uid-old".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        let a = at("2019-04-12T10:12:00Z");
        let view = view(&a, Some(&other));
        assert!(matches!(view, PodView::Foreign));
        let plan = plan(&a, view, now());
        assert_eq!(plan.status.phase, Some(Phase::Pending));
        assert_eq!(plan.pod, PodAction::Nothing);
        assert_eq!(ready_reason(&plan), POD_NAME_TAKEN);
        assert_eq!(reasons(&plan), ["Scheduled", POD_NAME_TAKEN]);
    }

    #[test]
    fn a_pod_that_cannot_start_says_so_once() {
        let at = running_at();
        let mut stuck = pod("Pending", None);
        let waiting = |reason: &str| ContainerStatus {
            name: CONTAINER.into(),
            image: "localhost/missing:1".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some(format!("Back-off {reason}")),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        stuck.status.as_mut().unwrap().container_statuses = Some(vec![waiting("ErrImagePull")]);
        let first = plan(&at, PodView::Ours(&stuck), now());
        let ready = find(&first.status.conditions, READY).unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            (
                "ImagePullBackOff",
                "Pod a-pod: image localhost/missing:1 of container busybox cannot be pulled"
            )
        );
        assert_eq!(
            first
                .notices
                .iter()
                .map(|n| (n.reason, n.warning))
                .collect::<Vec<_>>(),
            [("ImagePullBackOff", true)],
            "one Warning"
        );
        let at = written(at, &first);
        stuck.status.as_mut().unwrap().container_statuses = Some(vec![waiting("ImagePullBackOff")]);
        assert!(!plan(&at, PodView::Ours(&stuck), now()).writes(&at));
        stuck.status.as_mut().unwrap().container_statuses =
            Some(vec![waiting("ContainerCreating")]);
        let creating = plan(&at, PodView::Ours(&stuck), now());
        assert_eq!(
            find(&creating.status.conditions, READY).unwrap().message,
            "Pod a-pod runs the command"
        );
    }

    fn real_node<K: serde::de::DeserializeOwned>(file: &str) -> K {
        let path = format!(
            "{}/tests/fixtures/real-node/{file}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// An At and its pod as a v1.36.2 server and kubelet wrote them (the At by the operator
    /// before pods' problems were read): the reason once, then nothing; an unschedulable pod
    /// says so too.
    #[test]
    fn a_real_pod_that_cannot_start_gives_its_reason_once() {
        let at: At = real_node("at-at-nopull");
        let mut pod: Pod = real_node("pod-at-nopull");
        let first = plan(&at, view(&at, Some(&pod)), now());
        let ready = find(&first.status.conditions, READY).unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            (
                "ImagePullBackOff",
                "Pod at-nopull-pod: image localhost/does-not-exist:1 of container busybox cannot be pulled"
            )
        );
        assert_eq!(
            first.notices.iter().map(|n| n.reason).collect::<Vec<_>>(),
            ["ImagePullBackOff"]
        );
        let at = written(at, &first);
        assert!(!plan(&at, view(&at, Some(&pod)), now()).writes(&at));

        let unschedulable: Pod = real_node("pod-unschedulable");
        pod.status = unschedulable.status;
        let next = plan(&at, view(&at, Some(&pod)), now());
        let ready = find(&next.status.conditions, READY).unwrap();
        assert_eq!(ready.reason.as_str(), "Unschedulable");
        assert_eq!(
            next.notices
                .iter()
                .map(|n| (n.reason, n.warning))
                .collect::<Vec<_>>(),
            [("Unschedulable", true)]
        );
        assert_eq!(next.status.phase, Some(Phase::Running), "it may yet run");
    }
}
