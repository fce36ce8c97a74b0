//! The status of a CdnCluster and the Events its changes deserve: pure.

use super::sources::Problem;
use super::Error;
use crate::api::{CdnCluster, CdnClusterStatus, Condition, State};
pub use crate::kubernetes::apply::Change;
pub use crate::kubernetes::events::Notice;
use crate::kubernetes::problems;
use crate::kubernetes::record::PROGRESS_DEADLINE_EXCEEDED;
use crate::reconcile::conditions::{set_condition, ConditionStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};

pub const READY: &str = "Ready";
pub const SOURCES_READY: &str = "SourcesReady";
/// kstatus: true while the operator works towards the spec.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: true when the operator cannot make progress without a change of spec.
pub const STALLED: &str = "Stalled";

/// What the reconcile found, for the status.
#[derive(Clone, Copy)]
pub enum Observed<'a> {
    Problem(&'a Problem),
    /// Children are applied; the Deployment as last seen (None right after it was created), and
    /// the most telling problem of the cluster's pods, if one has any.
    Deployed(Option<&'a Deployment>, Option<&'a problems::Problem>),
    /// The API server refused a child.
    Refused(&'a Refusal),
}

/// A child the API server refused to apply (a quota, an admission webhook, RBAC, validation, or
/// an error of the server).
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub child: ObjectReference,
    /// The HTTP status code, when the server answered.
    pub code: Option<u16>,
    pub message: String,
}

impl Refusal {
    /// The refusal `error` tells of, in `namespace`: the child it names, the server's words.
    pub fn of(error: &Error, namespace: &str) -> Refusal {
        let (kind, name, source) = match error {
            Error::ApplyChild { kind, name, source } => (Some(kind), Some(name), Some(source)),
            Error::WriteStatus(_) => (None, None, None),
        };
        let (code, message) = match source {
            Some(source) => crate::kubernetes::errors::refusal(source),
            None => (None, error.to_string()),
        };
        Refusal {
            child: ObjectReference {
                kind: kind.cloned(),
                name: name.cloned(),
                namespace: Some(namespace.to_string()),
                ..ObjectReference::default()
            },
            code,
            message,
        }
    }

    /// Whether retrying cannot help until something else changes (the request itself was
    /// refused: 4xx), rather than a conflict, a rate limit or a server or network failure.
    pub fn is_stalled(&self) -> bool {
        self.code
            .is_some_and(|c| (400..500).contains(&c) && c != 409 && c != 429)
    }

    /// The condition message: the child named, the server's words.
    pub fn describe(&self) -> String {
        let kind = self.child.kind.as_deref().unwrap_or_default();
        let name = self.child.name.as_deref().unwrap_or_default();
        match self.code {
            Some(code) => format!("{kind} {name} was refused ({code}): {}", self.message),
            None => format!("{kind} {name} could not be applied: {}", self.message),
        }
    }
}

/// A child the reconcile wrote, for the Events.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildChange {
    pub child: ObjectReference,
    pub change: Change,
}

/// The status `cluster` should have now. Conditions keep their lastTransitionTime while their
/// status does not change, so an unchanged world gives an identical status (and no write).
pub fn desired(cluster: &CdnCluster, observed: Observed<'_>, now: &Time) -> CdnClusterStatus {
    let previous = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let replicas = cluster.spec.replicas;
    let mut status = CdnClusterStatus {
        observed_generation: generation,
        conditions: previous.conditions.clone(),
        ..CdnClusterStatus::default()
    };
    let mut set = |type_: &str, s: ConditionStatus, reason: &str, message: String| {
        set_condition(
            &mut status.conditions,
            type_,
            s,
            reason,
            message,
            generation,
            now,
        )
    };
    use ConditionStatus::{False, True};
    let state = match observed {
        Observed::Problem(problem @ Problem::Missing(_)) => {
            let message = describe(problem);
            set(SOURCES_READY, False, "SourceNotFound", message.clone());
            set(READY, False, "WaitingSource", message.clone());
            set(RECONCILING, True, "WaitingSource", message);
            set(
                STALLED,
                False,
                "WaitingSource",
                "Waiting for sources, not stalled".into(),
            );
            State::WaitingSource
        }
        Observed::Problem(problem @ Problem::Invalid(_)) => {
            let message = describe(problem);
            set(SOURCES_READY, False, "InvalidSpec", message.clone());
            set(READY, False, "InvalidSpec", message.clone());
            set(RECONCILING, False, "InvalidSpec", message.clone());
            set(STALLED, True, "InvalidSpec", message);
            State::Invalid
        }
        Observed::Refused(refusal) => {
            let message = refusal.describe();
            status.replicas = previous.replicas;
            status.ready_replicas = previous.ready_replicas;
            status.ready = previous.ready.clone();
            set(
                SOURCES_READY,
                True,
                "SourcesFound",
                "Every source exists".into(),
            );
            set(READY, False, "ApplyFailed", message.clone());
            if refusal.is_stalled() {
                set(RECONCILING, False, "ApplyFailed", message.clone());
                set(STALLED, True, "ApplyFailed", message);
            } else {
                set(RECONCILING, True, "ApplyFailed", message);
                set(
                    STALLED,
                    False,
                    "ApplyFailed",
                    "Retrying with backoff".into(),
                );
            }
            State::Error
        }
        Observed::Deployed(deployment, _) => {
            let ready = ready_replicas(deployment);
            status.replicas = Some(replicas);
            status.ready_replicas = Some(ready);
            status.ready = Some(format!("{ready}/{replicas}"));
            set(
                SOURCES_READY,
                True,
                "SourcesFound",
                "Every source exists".into(),
            );
            let deadline_exceeded = deployment.is_some_and(problems::deadline_exceeded);
            if rolled_out(deployment, replicas) {
                let message = format!("{ready}/{replicas} replicas are ready");
                set(STALLED, False, "Deployed", "Children are applied".into());
                set(READY, True, "Running", message.clone());
                set(RECONCILING, False, "Running", message);
                State::Running
            } else if let Some(problem) = problem(&observed) {
                // Why the replicas are not ready, at once; Stalled only once the Deployment
                // itself gave up (kstatus's rule for a Deployment): a pod that cannot start
                // may yet (a node added, a Secret created).
                let reason = problem.reason;
                // While the reason stays, so does the message: what a crashing program printed
                // last can differ from one restart to the next (a race of its own), and a spec
                // edit leaves the old pods crashing beside the new ones for a while: neither is
                // a new problem, worth a write and a Warning.
                let kept = crate::reconcile::conditions::find(&previous.conditions, READY)
                    .filter(|c| c.status.as_str() == "False" && c.reason.as_str() == reason)
                    .map(|c| c.message.to_string());
                let message = kept.unwrap_or(problem.message);
                set(READY, False, reason, message.clone());
                if deadline_exceeded {
                    set(RECONCILING, False, reason, message.clone());
                    set(STALLED, True, PROGRESS_DEADLINE_EXCEEDED, message);
                } else {
                    set(RECONCILING, True, reason, message);
                    set(STALLED, False, "Deployed", "Children are applied".into());
                }
                State::Deploying
            } else {
                let message = format!("{ready}/{replicas} replicas are ready, rolling out");
                set(STALLED, False, "Deployed", "Children are applied".into());
                set(READY, False, "Deploying", message.clone());
                set(RECONCILING, True, "Deploying", message);
                State::Deploying
            }
        }
    };
    status.state = Some(state);
    status.selector = Some(super::build::pod_selector_string(&cluster.name_any()));
    status
}

/// Why the replicas of a deployed cluster are not ready, if something says: its pods' most
/// telling problem, else its Deployment's exceeded progress deadline.
pub fn problem(observed: &Observed<'_>) -> Option<problems::Problem> {
    let Observed::Deployed(deployment, pods) = observed else {
        return None;
    };
    let deadline = deployment.is_some_and(problems::deadline_exceeded);
    pods.cloned()
        .or_else(|| deadline.then(problems::progress_deadline_exceeded))
}

/// A reference to the CdnCluster `name`, which may not exist (yet).
fn cluster_reference(name: &str, namespace: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some(CdnCluster::api_version(&()).into()),
        kind: Some(CdnCluster::kind(&()).into()),
        name: Some(name.into()),
        namespace,
        ..ObjectReference::default()
    }
}

/// The message of the Ready condition (and of `cdn-operator render`) for a cluster that cannot be
/// deployed: the first missing source, as the seed words it, or why the spec is invalid.
pub fn describe(problem: &Problem) -> String {
    match problem {
        Problem::Missing(names) => source_not_found(&names[0]),
        Problem::Invalid(message) => message.clone(),
    }
}

/// The seed's message for a missing source.
pub fn source_not_found(name: &str) -> String {
    format!("Source {name} not found, will retry later")
}

fn ready_replicas(deployment: Option<&Deployment>) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// Every replica of the current spec is updated and ready.
pub fn rolled_out(deployment: Option<&Deployment>, replicas: i32) -> bool {
    let Some(d) = deployment else { return false };
    let Some(s) = d.status.as_ref() else {
        return false;
    };
    let current = s.observed_generation >= d.metadata.generation;
    current
        && s.updated_replicas.unwrap_or(0) >= replicas
        && s.ready_replicas.unwrap_or(0) >= replicas
        && s.replicas.unwrap_or(0) <= replicas
}

/// The Events the change from `cluster`'s current status to `next` deserves, and the children
/// this reconcile wrote: one per transition or change, none when nothing changed.
pub fn notices(
    cluster: &CdnCluster,
    next: &CdnClusterStatus,
    observed: &Observed<'_>,
    changes: &[ChildChange],
) -> Vec<Notice> {
    let namespace = cluster.namespace();
    let previous = cluster.status.clone().unwrap_or_default();
    let before = |t: &str| crate::reconcile::conditions::find(&previous.conditions, t);
    let after = |t: &str| crate::reconcile::conditions::find(&next.conditions, t);
    // Children were applied before (a replica count is reported only then): a missing one was
    // deleted by someone, not yet to be created.
    let deployed_before = previous.replicas.is_some();
    // A PodDisruptionBudget or an Ingress exists only when the spec asks: one created after a
    // change of the spec is new; without one, it was deleted by someone.
    let spec_unchanged = previous.observed_generation == cluster.metadata.generation;
    let mut out: Vec<Notice> = changes
        .iter()
        .filter_map(|c| {
            let optional = matches!(
                c.child.kind.as_deref(),
                Some("PodDisruptionBudget" | "Ingress")
            );
            child_notice(c, deployed_before && (!optional || spec_unchanged))
        })
        .collect();
    match (next.state, observed) {
        (Some(State::WaitingSource), _) => {
            let msg = after(SOURCES_READY).map(|c| c.message.clone());
            if before(SOURCES_READY).map(|c| c.message.clone()) != msg
                || previous.state != next.state
            {
                // Events are folded by reason and objects, not by message: naming the missing
                // source keeps "cache-vod not found" apart from an earlier "cache-live not found".
                let notice =
                    Notice::normal("SourceNotFound", msg.map(String::from).unwrap_or_default());
                out.push(match observed {
                    Observed::Problem(Problem::Missing(names)) => {
                        notice.about(cluster_reference(&names[0], namespace.clone()))
                    }
                    _ => notice,
                });
            }
        }
        (Some(State::Invalid), _) => {
            let msg = after(STALLED).map(|c| c.message.clone());
            if before(STALLED).map(|c| c.message.clone()) != msg || previous.state != next.state {
                out.push(Notice::warning(
                    "InvalidSpec",
                    msg.map(String::from).unwrap_or_default(),
                ));
            }
        }
        (Some(State::Error), Observed::Refused(refusal)) => {
            let msg = after(READY).map(|c| c.message.clone());
            if before(READY).map(|c| c.message.clone()) != msg || previous.state != next.state {
                let notice =
                    Notice::warning("ApplyFailed", msg.map(String::from).unwrap_or_default());
                out.push(notice.about(refusal.child.clone()));
            }
        }
        // One Warning per distinct problem: not one per retry of the kubelet (the message is
        // the same), nor one per reconcile.
        (Some(State::Deploying), _) if problem(observed).is_some() => {
            let reason = problem(observed).expect("matched").reason;
            let ready = |c: Option<&Condition>| c.map(|c| (c.reason.clone(), c.message.clone()));
            if ready(before(READY)) != ready(after(READY)) {
                let message = after(READY)
                    .map(|c| c.message.to_string())
                    .unwrap_or_default();
                out.push(Notice::warning(reason, message));
            }
        }
        (Some(State::Running), _) if previous.state != Some(State::Running) => {
            out.push(Notice::normal(
                "Running",
                format!(
                    "All {} replicas of {} are ready",
                    next.replicas.unwrap_or(0),
                    cluster.name_any()
                ),
            ))
        }
        // Same generation: nothing asked for a rollout, replicas were lost.
        (Some(State::Deploying), _)
            if previous.state == Some(State::Running)
                && previous.observed_generation == next.observed_generation =>
        {
            let message = after(READY)
                .map(|c| c.message.to_string())
                .unwrap_or_default();
            out.push(Notice::warning("ReplicasUnavailable", message))
        }
        _ => {}
    }
    out
}

/// The Event a written child deserves. A Deployment's creation is the seed's `DeploymentCreated`,
/// first time or again (the original operator announced a re-created Deployment so); a
/// ConfigMap or Service is created silently with its cluster, and re-created with a Warning.
fn child_notice(change: &ChildChange, deployed_before: bool) -> Option<Notice> {
    let kind = change.child.kind.as_deref().unwrap_or_default();
    let name = change.child.name.as_deref().unwrap_or_default();
    let notice = match change.change {
        Change::Created if kind == "Deployment" => Notice::normal(
            "DeploymentCreated",
            format!("The Deployment {name} has been created"),
        ),
        Change::Created if deployed_before => Notice::warning(
            "ChildRestored",
            format!("{kind} {name} was deleted outside the operator; re-created it"),
        ),
        Change::Created => return None,
        Change::Updated => Notice::normal(
            "ChildUpdated",
            format!("{kind} {name} updated to the current spec"),
        ),
        Change::Restored => Notice::warning(
            "ChildRestored",
            format!("{kind} {name} was changed outside the operator; restored it"),
        ),
    };
    Some(notice.about(change.child.clone()))
}
