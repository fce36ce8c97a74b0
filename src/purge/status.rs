//! What a CdnPurge's status should say, and the Events its changes deserve. Pure.
//!
//! A purge's status is written when something a reader acts on changes: it failed, it is
//! complete, or (past [`super::REPORT_AFTER`]) it is under way or a pod keeps it waiting; its
//! counts alone every so often ([`report`]). A purge that completes within that time is written
//! once, Complete.

use super::dispatch::Progress;
use super::REPORT_AFTER;
use crate::api::{CdnPurgeStatus, PurgePhase};
use crate::kubernetes::events::Notice;
use crate::reconcile::conditions::{find, set_condition, ConditionStatus};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// kstatus conditions.
pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";

/// Reasons.
pub const COMPLETE: &str = "Complete";
pub const PURGING: &str = "Purging";
pub const POD_NOT_PURGED: &str = "PodNotPurged";
pub const INVALID: &str = "InvalidPurge";
pub const CLUSTER_NOT_FOUND: &str = "CdnClusterNotFound";
pub const NO_SIGNING_KEY: &str = "NoSigningKey";
pub const NOT_APPLICABLE: &str = "PurgeNotApplicable";

/// Event reasons.
pub const PURGED: &str = "Purged";
pub const RETRYING: &str = "PurgeRetrying";

/// What became of a purge.
#[derive(Debug)]
pub enum Observed<'a> {
    /// It cannot be applied: why (a reason above) and how to fix it.
    Failed {
        reason: &'static str,
        message: String,
    },
    /// Its job, reaching `clusters`.
    Applying {
        clusters: &'a [String],
        progress: &'a Progress,
    },
}

/// Seconds: the API keeps no finer time.
fn stamp(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// The status of a purge whose status is `previous`, at `generation`, given what was observed.
pub fn desired(
    previous: Option<&CdnPurgeStatus>,
    generation: Option<i64>,
    observed: &Observed<'_>,
    now: Timestamp,
) -> CdnPurgeStatus {
    let previous = previous.cloned().unwrap_or_default();
    let mut status = CdnPurgeStatus {
        observed_generation: generation,
        ..previous
    };
    let now = stamp(now);
    use ConditionStatus::{False, True};
    let mut set = |type_: &str, value: ConditionStatus, reason: &str, message: &str| {
        set_condition(
            &mut status.conditions,
            type_,
            value,
            reason,
            message.to_string(),
            generation,
            &now,
        )
    };
    match observed {
        Observed::Failed { reason, message } => {
            set(READY, False, reason, message);
            set(RECONCILING, False, reason, message);
            set(STALLED, True, reason, message);
            status.phase = Some(PurgePhase::Failed);
        }
        Observed::Applying { clusters, progress } => {
            status.clusters = clusters.to_vec();
            status.start_time = Some(stamp(progress.started));
            status.pods = Some(progress.pods as i32);
            status.pods_purged = Some(progress.pods_done as i32);
            status.progress = Some(format!("{}/{}", progress.pods_done, progress.pods));
            status.objects = Some(progress.objects as i64);
            if let Some(why) = &progress.failed {
                set(READY, False, NOT_APPLICABLE, why);
                set(RECONCILING, False, NOT_APPLICABLE, why);
                set(STALLED, True, NOT_APPLICABLE, why);
                status.phase = Some(PurgePhase::Failed);
            } else if let Some(finished) = progress.finished {
                let message = complete_message(clusters, progress);
                status.completion_time = Some(stamp(finished));
                set(READY, True, COMPLETE, &message);
                set(RECONCILING, False, COMPLETE, &message);
                set(STALLED, False, COMPLETE, &message);
                status.phase = Some(PurgePhase::Complete);
            } else {
                let (reason, message) = match progress.waiting.values().next() {
                    Some(w) => (
                        POD_NOT_PURGED,
                        format!(
                            "waiting for pod {} of CdnCluster {}: {}; retried until it applies the purge or is gone",
                            w.pod, w.cluster, w.why
                        ),
                    ),
                    None => (PURGING, "applying the purge to the pods".to_string()),
                };
                set(READY, False, reason, &message);
                set(RECONCILING, True, reason, &message);
                set(STALLED, False, reason, &message);
                status.phase = Some(PurgePhase::Purging);
            }
        }
    }
    status
}

/// `4 objects invalidated on 3 pods of cache-a, cache-b in 0.31 s`.
fn complete_message(clusters: &[String], progress: &Progress) -> String {
    let took = progress
        .finished
        .map(|f| f.duration_since(progress.started).as_secs_f64())
        .unwrap_or(0.0);
    let on = if clusters.is_empty() {
        "no cache below the CdnCluster: nothing to purge".to_string()
    } else {
        format!(
            "{} objects invalidated on {} pods of {} in {took:.2} s",
            progress.objects,
            progress.pods_done,
            clusters.join(", ")
        )
    };
    on
}

/// How often the counts of a purge under way are written: after as long again as it has run,
/// within these bounds. A burst of slow purges then costs each a few writes, not one per pod's
/// answer (each write's own watch event brings a reconcile, which would write the next count).
pub const COUNTS_EVERY_MIN: Duration = Duration::from_secs(5);
pub const COUNTS_EVERY_MAX: Duration = Duration::from_secs(60);

/// When the status of a purge not over is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    Now,
    /// Not yet: the reconcile looks again then.
    After(Duration),
}

/// When `status` is written over `previous` for a purge under way for `running`, its status
/// last written by this process `written` ago: not before [`REPORT_AFTER`] (one that completes
/// sooner is written once, Complete); then at once when what a reader acts on changes (its
/// phase, or the pod it waits for); its counts alone, every so often ([`COUNTS_EVERY_MIN`]).
pub fn report(
    previous: Option<&CdnPurgeStatus>,
    status: &CdnPurgeStatus,
    running: Duration,
    written: Option<Duration>,
) -> Report {
    if running < REPORT_AFTER {
        return Report::After(REPORT_AFTER - running);
    }
    let said = |s: Option<&CdnPurgeStatus>| {
        s.map(|s| {
            let ready = find(&s.conditions, READY).map(|c| (c.reason.clone(), c.message.clone()));
            (s.phase, ready)
        })
    };
    if said(previous) != said(Some(status)) {
        return Report::Now;
    }
    let every = running.clamp(COUNTS_EVERY_MIN, COUNTS_EVERY_MAX);
    match written {
        Some(ago) if ago < every => Report::After(every - ago),
        _ if previous == Some(status) => Report::After(every),
        _ => Report::Now,
    }
}

/// The Events of a change from `previous` to `status`: one when the purge completes or fails, one
/// when a pod first keeps it waiting.
pub fn notices(previous: Option<&CdnPurgeStatus>, status: &CdnPurgeStatus) -> Vec<Notice> {
    let ready = |s: Option<&CdnPurgeStatus>| {
        s.and_then(|s| find(&s.conditions, READY))
            .map(|c| (c.reason.to_string(), c.message.to_string()))
    };
    let before = ready(previous);
    let Some((reason, message)) = ready(Some(status)) else {
        return Vec::new();
    };
    if before.as_ref().map(|(r, _)| r.as_str()) == Some(reason.as_str()) {
        return Vec::new();
    }
    match reason.as_str() {
        COMPLETE => vec![Notice::normal(PURGED, message)],
        PURGING => Vec::new(),
        POD_NOT_PURGED => vec![Notice::warning(RETRYING, message)],
        INVALID => vec![Notice::warning(INVALID, message)],
        CLUSTER_NOT_FOUND => vec![Notice::warning(CLUSTER_NOT_FOUND, message)],
        NO_SIGNING_KEY => vec![Notice::warning(NO_SIGNING_KEY, message)],
        _ => vec![Notice::warning(NOT_APPLICABLE, message)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::purge::dispatch::Waiting;
    use std::collections::BTreeMap;

    fn progress() -> Progress {
        Progress {
            started: Timestamp::from_second(1_800_000_000).unwrap(),
            finished: None,
            pods: 3,
            pods_done: 1,
            objects: 7,
            waiting: BTreeMap::new(),
            failed: None,
            status_written: None,
        }
    }

    fn ready(status: &CdnPurgeStatus) -> (String, String, String) {
        let c = find(&status.conditions, READY).unwrap();
        (
            c.status.to_string(),
            c.reason.to_string(),
            c.message.to_string(),
        )
    }

    #[test]
    fn a_purge_under_way_writes_what_readers_act_on_at_once_and_its_counts_every_so_often() {
        let clusters = vec!["shield".to_string()];
        let now = Timestamp::from_second(1_800_000_001).unwrap();
        let mut p = progress();
        let status = |p: &Progress, previous: Option<&CdnPurgeStatus>| {
            let observed = Observed::Applying {
                clusters: &clusters,
                progress: p,
            };
            desired(previous, Some(1), &observed, now)
        };
        let s = Duration::from_secs;
        let purging = status(&p, None);
        // Not before REPORT_AFTER: one that completes sooner is written once, Complete.
        assert_eq!(
            report(None, &purging, Duration::from_millis(500), None),
            Report::After(Duration::from_millis(1500))
        );
        // Then Purging at once, whenever this process last wrote.
        assert_eq!(report(None, &purging, s(3), None), Report::Now);
        assert_eq!(report(None, &purging, s(3), Some(s(0))), Report::Now);
        // One more pod done: the counts wait for as long again as it has run (5 s at least).
        p.pods_done = 2;
        let counted = status(&p, Some(&purging));
        assert_ne!(counted, purging);
        assert_eq!(
            report(Some(&purging), &counted, s(3), Some(s(1))),
            Report::After(s(4))
        );
        assert_eq!(
            report(Some(&purging), &counted, s(30), Some(s(10))),
            Report::After(s(20))
        );
        assert_eq!(
            report(Some(&purging), &counted, s(600), Some(s(59))),
            Report::After(s(1))
        );
        assert_eq!(
            report(Some(&purging), &counted, s(30), Some(s(30))),
            Report::Now
        );
        // Written by another leader: this one writes its counts once.
        assert_eq!(report(Some(&purging), &counted, s(30), None), Report::Now);
        // Nothing changed: nothing to write.
        assert_eq!(
            report(Some(&purging), &purging, s(30), None),
            Report::After(s(30))
        );
        // A pod keeps it waiting: at once.
        p.waiting.insert(
            "shield-0".into(),
            Waiting {
                pod: "shield-0".into(),
                cluster: "shield".into(),
                why: "no answer".into(),
            },
        );
        let waiting = status(&p, Some(&counted));
        assert_eq!(
            report(Some(&counted), &waiting, s(30), Some(s(1))),
            Report::Now
        );
    }

    #[test]
    fn a_purge_goes_purging_then_complete_with_one_event() {
        let clusters = vec!["shield".to_string(), "edge-cache".to_string()];
        let now = Timestamp::from_second(1_800_000_001).unwrap();
        let mut p = progress();
        let purging = desired(
            None,
            Some(1),
            &Observed::Applying {
                clusters: &clusters,
                progress: &p,
            },
            now,
        );
        assert_eq!(purging.phase, Some(PurgePhase::Purging));
        assert_eq!(purging.progress.as_deref(), Some("1/3"));
        assert!(notices(None, &purging).is_empty());
        // The same world: the same status, nothing to write.
        assert_eq!(
            desired(
                Some(&purging),
                Some(1),
                &Observed::Applying {
                    clusters: &clusters,
                    progress: &p
                },
                now
            ),
            purging
        );
        p.waiting.insert(
            "edge-cache-1".into(),
            Waiting {
                pod: "edge-cache-1".into(),
                cluster: "edge-cache".into(),
                why: "10.0.0.7:9113: connection refused".into(),
            },
        );
        let waiting = desired(
            Some(&purging),
            Some(1),
            &Observed::Applying {
                clusters: &clusters,
                progress: &p,
            },
            now,
        );
        let (_, reason, message) = ready(&waiting);
        assert_eq!(reason, POD_NOT_PURGED);
        assert!(
            message.contains(
                "pod edge-cache-1 of CdnCluster edge-cache: 10.0.0.7:9113: connection refused"
            ),
            "{message}"
        );
        let events = notices(Some(&purging), &waiting);
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].warning, events[0].reason), (true, RETRYING));
        p.waiting.clear();
        p.pods_done = 3;
        p.finished = Some(Timestamp::from_second(1_800_000_002).unwrap());
        let complete = desired(
            Some(&waiting),
            Some(1),
            &Observed::Applying {
                clusters: &clusters,
                progress: &p,
            },
            now,
        );
        assert_eq!(complete.phase, Some(PurgePhase::Complete));
        assert_eq!(
            ready(&complete),
            (
                "True".into(),
                COMPLETE.into(),
                "7 objects invalidated on 3 pods of shield, edge-cache in 2.00 s".into()
            )
        );
        assert_eq!(
            complete.completion_time,
            Some(Time(Timestamp::from_second(1_800_000_002).unwrap()))
        );
        let events = notices(Some(&waiting), &complete);
        assert_eq!(
            (events.len(), events[0].reason, events[0].warning),
            (1, PURGED, false)
        );
        assert!(notices(Some(&complete), &complete).is_empty());
    }

    #[test]
    fn a_purge_that_cannot_be_applied_fails_once_with_its_reason() {
        let now = Timestamp::from_second(1_800_000_001).unwrap();
        let failed = desired(
            None,
            Some(1),
            &Observed::Failed {
                reason: CLUSTER_NOT_FOUND,
                message: "there is no CdnCluster edge in the namespace".into(),
            },
            now,
        );
        assert_eq!(failed.phase, Some(PurgePhase::Failed));
        let stalled = find(&failed.conditions, STALLED).unwrap();
        assert_eq!(stalled.status, "True");
        let events = notices(None, &failed);
        assert_eq!(
            (events[0].reason, events[0].warning),
            (CLUSTER_NOT_FOUND, true)
        );
        assert!(notices(Some(&failed), &failed).is_empty());
    }
}
