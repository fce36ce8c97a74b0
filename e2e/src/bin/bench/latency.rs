//! The spec changes: each cache's `spec.cache.valid` changed in turn, timed until its ConfigMap
//! is updated (seen by the benchmark's watch), and where the time went: the server's answer to
//! the change, the change's watch event, the operator's ConfigMap apply as the proxy forwarded
//! and timed it.

use crate::stats::{ms, percentile, Answers};
use crate::watch::{seen_at, Watches};
use cdn_operator::api::{CdnCluster, Role};
use cdn_operator::cdncluster::build;
use cdn_operator_e2e::proxy::{LoggedWrite, Proxy};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};

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

/// One spec change, in milliseconds from its request: when the server answered it, when the
/// benchmark's own watch saw the change (about when the operator's did: the server sends both),
/// when the proxy forwarded the operator's ConfigMap apply, and how long that apply took to
/// answer. What remains of `total` is the ConfigMap's watch event reaching the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ChangeSample {
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
pub struct ChangePath {
    pub event_seen_p50: f64,
    pub event_seen_p99: f64,
    /// From the benchmark's sight of the change to the operator's apply forwarded: the
    /// operator's own part (with one hop through the proxy each way).
    pub reaction_p50: f64,
    pub reaction_p99: f64,
    pub apply_sent_p50: f64,
    pub apply_sent_p99: f64,
    pub apply_answer_p50: f64,
    pub apply_answer_p99: f64,
    /// Changes whose apply the proxy did not see (another writer's, or none).
    applies_missing: usize,
    pub slowest: Vec<ChangeSample>,
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

/// What the spec changes measured.
pub struct SpecChanges {
    /// Each change until its ConfigMap was seen updated, in milliseconds, sorted.
    pub latencies: Vec<f64>,
    /// The server's answer to each change, in milliseconds, sorted.
    pub change_answers: Vec<f64>,
    pub path: ChangePath,
    /// The server's answers to the operator's writes meanwhile.
    pub operator_answers: Answers,
}

/// Changes the spec of the first `samples` caches of `manifests`, one after the other, each
/// timed until the benchmark's watch sees its ConfigMap updated.
pub async fn spec_changes(
    client: &Client,
    proxy: &Proxy,
    watches: &Watches,
    manifests: &[CdnCluster],
    samples: usize,
) -> SpecChanges {
    let caches: Vec<&CdnCluster> = manifests
        .iter()
        .filter(|c| c.spec.role == Role::Cache)
        .take(samples)
        .collect();
    eprintln!("bench: timing {} spec changes", caches.len());
    let tick = &watches.tick;
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
        let before = watches.config_maps.version(&config_map);
        let cluster = format!("{ns}/{}", cache.name_any());
        let cluster_before = watches.clusters.version(&cluster);
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
            seen_at(tick, t, limit, || watches.clusters.version(&cluster)
                != cluster_before),
            seen_at(tick, t, limit, || watches.config_maps.version(&config_map)
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
        let apply = logged_write(proxy, &config_map_path, t).await;
        sample.apply_sent = apply.as_ref().map(|a| ms(a.forwarded - t));
        sample.apply_answer = apply.map(|a| ms(a.answer));
        samples.push(sample);
    }
    let path = ChangePath::of(&samples);
    let operator_answers = Answers::of(
        &proxy.write_times_since(changes_mark),
        changes_start.elapsed(),
    );
    SpecChanges {
        latencies,
        change_answers,
        path,
        operator_answers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
