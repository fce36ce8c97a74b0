//! The CDN changing under traffic: a configuration change applied as Kubernetes would (row 14), a
//! cache cluster scaled to three pods (15).

use cdn_operator::cdncluster::nginx::{CACHE_STATUS_HEADER, UPSTREAM_HEADER};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::cdn::Cdn;
use crate::client::Client;
use crate::lab::{publish, Setup, EDGE, PODS};
use crate::pods::{render, start_pod};
use crate::report::{figure, Figure};
use crate::traffic::{segment, Failures};
use crate::util::wait_for;

impl Cdn {
    /// Row 14: 200 segments warmed through the balancer; a pass over them (hit ratio); the
    /// caches' configuration changed (`cache: {valid: 20m}`), rendered again and applied as
    /// Kubernetes would ([`Cdn::apply`]); a second pass (hit ratio).
    pub(super) fn row14_config_change(&mut self, setup: &Setup) -> Vec<Figure> {
        let segments: Vec<String> = (1000..1200).map(segment).collect();
        let mut client = Client::new(EDGE);
        let pass = |client: &mut Client| {
            segments
                .iter()
                .filter(|p| {
                    client.get(p).is_ok_and(|r| {
                        r.status == 200 && r.header(CACHE_STATUS_HEADER) == Some("HIT")
                    })
                })
                .count()
        };
        pass(&mut client);
        let before = pass(&mut client);
        let applied = match render(
            &self.binary,
            &self.dir,
            "topology-changed.yaml",
            Some("valid: 20m"),
            false,
            false,
        ) {
            Ok(desired) => {
                let changed: Vec<&str> = PODS
                    .iter()
                    .filter(|(c, _)| self.desired[*c].files != desired[*c].files)
                    .map(|(c, _)| *c)
                    .collect();
                let mut done = self.apply(setup, desired);
                done.insert("configs changed".into(), changed.join(", "));
                done
            }
            Err(e) => BTreeMap::from([("error".to_string(), e)]),
        };
        let mut client = Client::new(EDGE);
        let after = pass(&mut client);
        let (rb, ra) = (before as f64 / 2.0, after as f64 / 2.0);
        vec![figure(
            "14",
            format!("{rb:.0} % -> {ra:.0} %"),
            Some(before > 0 && after as f64 >= 0.9 * before as f64),
            json!({
                "hits_before": before,
                "hits_after": after,
                "objects": segments.len(),
                "applied": applied,
            }),
        )]
    }

    /// Row 15: cache-1 scaled to three pods, its headless Service naming each; 90 objects asked
    /// three times through the balancer (in order, in reverse, in order). The origin's fetches
    /// per object: 1 when each object has one pod, up to 3 when the balancer takes turns between
    /// the pods of one name. cache-1 goes back to one pod afterwards.
    pub(super) fn row15_replicas(&mut self, setup: &Setup) -> Vec<Figure> {
        const EXTRA: [&str; 2] = ["127.0.0.13", "127.0.0.14"];
        let one = PODS[1].1;
        let three = [one, EXTRA[0], EXTRA[1]];
        let mut extra = Vec::new();
        for (k, ip) in EXTRA.iter().enumerate() {
            match start_pod(
                setup,
                &self.dir,
                "cache-1",
                ip,
                &self.desired["cache-1"],
                100 + k as u32,
                &self.binary,
            ) {
                Ok(pod) => extra.push(pod),
                Err(e) => {
                    return vec![figure(
                        "15",
                        format!("not measured: {e}"),
                        None,
                        Value::Null,
                    )]
                }
            }
        }
        // The members the balancer sends 60 probes (paths no object has) to.
        let probed = || -> BTreeSet<String> {
            let mut client = Client::new(EDGE);
            (0..60)
                .filter_map(|i| client.get(&format!("/probe/r15-{i}")).ok())
                .filter_map(|r| r.header(UPSTREAM_HEADER).map(str::to_string))
                .flat_map(|a| a.split(", ").map(str::to_string).collect::<Vec<_>>())
                .collect()
        };
        let member = |ip: &str| format!("{ip}:80");
        publish(&setup.dns, "cache-1", true, &three);
        // Within the balancer's lookup lifetime (5 s).
        let found = wait_for(Duration::from_secs(20), || {
            let seen = probed();
            three.iter().all(|ip| seen.contains(&member(ip)))
        });

        let mark = self.log.mark();
        let objects: Vec<String> = (0..90).map(|i| format!("/obj/r15-{i}")).collect();
        let mut client = Client::new(EDGE);
        let mut failures = Failures::default();
        let mut members: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for pass in 0..3 {
            let order: Vec<&String> = if pass == 1 {
                objects.iter().rev().collect()
            } else {
                objects.iter().collect()
            };
            for object in order {
                let r = client.get(object);
                if let Ok(r) = &r {
                    if let Some(a) = r.header(UPSTREAM_HEADER) {
                        members.entry(object).or_default().insert(a.to_string());
                    }
                }
                failures.check(r, 200);
            }
        }
        let fetches = self
            .log
            .settle(mark, "/obj/r15-", Duration::from_millis(300))
            .len();
        let on_three = members
            .values()
            .flatten()
            .filter(|a| EXTRA.iter().any(|ip| **a == member(ip)))
            .count();

        publish(&setup.dns, "cache-1", true, &[one]);
        let back = wait_for(Duration::from_secs(20), || {
            let seen = probed();
            !EXTRA.iter().any(|ip| seen.contains(&member(ip)))
        });
        for pod in extra {
            pod.nginx.stop();
        }
        let per_object = fetches as f64 / objects.len() as f64;
        let found_note = if found {
            ""
        } else {
            ", the pods never all seen"
        };
        vec![figure(
            "15",
            format!(
                "{per_object:.2} ({fetches} fetches of {} objects asked 3 times{found_note}{})",
                objects.len(),
                failures.suffix()
            ),
            Some(found && fetches == objects.len() && failures.count == 0),
            json!({
                "fetches": fetches,
                "objects": objects.len(),
                "passes": 3,
                "all_pods_seen": found,
                "answers_by_the_added_pods": on_three,
                "objects_answered_by_more_than_one_member": members.values().filter(|m| m.len() > 1).count(),
                "back_to_one_pod": back,
                "failed": failures.to_json(),
            }),
        )]
    }
}
