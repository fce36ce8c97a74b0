//! Purges, signed with the benchmark's key and sent to the cache pods' sidecars as the operator's
//! dispatcher sends them: a burst of 1,000 paths (row 16), one surrogate key of 10,000 objects
//! (17).

use cdn_operator::cdncluster::nginx::CACHE_STATUS_HEADER;
use cdn_operator::nginx_cache::wire::{self, Applied, Batch};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::cdn::Cdn;
use crate::client::Client;
use crate::lab::{Setup, EDGE, METRICS_PORT, NAMESPACE, PODS};
use crate::pods::{takes_purges, Desired};
use crate::report::{figure, Figure};
use crate::traffic::{cache_status, warm};
use crate::util::chmod;

impl Cdn {
    /// The topology with every pod's sidecar (rendered with a metrics image, as row 2m), its
    /// caches' sidecars applying purges signed with the benchmark's key; `Err` when this binary
    /// renders no sidecar that applies purges.
    fn with_purging_sidecars(
        &mut self,
        setup: &Setup,
    ) -> Result<BTreeMap<String, Desired>, String> {
        let counted = self.render_counted()?;
        if !counted.values().any(takes_purges) {
            return Err("this binary's sidecars apply no purges".into());
        }
        let plain = self.desired.clone();
        if self.desired[PODS[1].0].deployment != counted[PODS[1].0].deployment {
            let done = self.apply(setup, counted);
            if let Some(failed) = done.values().find(|d| d.contains("failed")) {
                return Err(failed.clone());
            }
        }
        Ok(plain)
    }

    /// Sends `purges` as one batch to the sidecar of each cache pod, at once; what each applied.
    fn purge(&self, setup: &Setup, purges: &[wire::Purge]) -> Result<Vec<Applied>, String> {
        std::thread::scope(|s| {
            let sends: Vec<_> = PODS
                .iter()
                .filter(|(cluster, _)| takes_purges(&self.desired[*cluster]))
                .map(|(cluster, ip)| {
                    s.spawn(move || {
                        let issued = SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map(|d| d.as_secs() as i64)
                            .unwrap_or(0);
                        let batch = Batch {
                            id: format!("{cluster}-{}", next_batch()),
                            issued,
                            expires: issued + wire::VALIDITY_SECONDS,
                            cluster: format!("{NAMESPACE}/{cluster}"),
                            purges: purges.to_vec(),
                        };
                        let body = serde_json::to_vec(&batch).expect("a batch");
                        let signature = wire::signature_header(&setup.signer.sign(&body));
                        let addr = format!("{ip}:{METRICS_PORT}");
                        let r = cdn_operator_testkit::request(
                            &addr,
                            "POST",
                            wire::PURGE_PATH,
                            &[(wire::SIGNATURE_HEADER, &signature)],
                            &body,
                        )
                        .map_err(|e| format!("{addr}: {e}"))?;
                        if r.status != 200 {
                            return Err(format!("{addr}: {} {}", r.status, r.body.trim()));
                        }
                        serde_json::from_str::<Applied>(&r.body).map_err(|e| format!("{addr}: {e}"))
                    })
                })
                .collect();
            sends
                .into_iter()
                .map(|t| t.join().expect("a send"))
                .collect()
        })
    }

    /// Row 16: 1,000 purges at once. 2,000 versioned objects (`/pv/NNNN`) cached through the
    /// balancer; the first 1,000 changed at the origin; then a purge per changed object, all at
    /// once, sent as the operator's dispatcher sends a burst: each cache pod gets the first purge
    /// alone, and the 999 that came meanwhile in one batch once it answered. Eight threads poll
    /// the purged objects through the balancer from the burst on, each until it serves the new
    /// body: the time of each. Once both batches are applied: stale bodies among the purged
    /// objects, and hits among the 1,000 not purged.
    pub(super) fn row16_purge_burst(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            ["16a", "16b", "16c"]
                .map(|id| figure(id, format!("not measured: {why}"), None, Value::Null))
                .to_vec()
        };
        let plain = match self.with_purging_sidecars(setup) {
            Ok(plain) => plain,
            Err(why) => return not_measured(why),
        };
        let figures = self.purge_burst(setup).unwrap_or_else(not_measured);
        if self.desired[PODS[1].0].deployment != plain[PODS[1].0].deployment {
            self.apply(setup, plain);
        }
        figures
    }

    fn purge_burst(&mut self, setup: &Setup) -> Result<Vec<Figure>, String> {
        const OBJECTS: usize = 2000;
        const PURGED: usize = 1000;
        let pv = setup.www.join("pv");
        std::fs::create_dir_all(&pv).map_err(|e| e.to_string())?;
        chmod(&pv, 0o755);
        let path = |i: usize| format!("/pv/{i:04}");
        let write = |i: usize, version: &str| {
            // Replaced, not rewritten in place: the origin may be sending the old one.
            let file = pv.join(format!("{i:04}"));
            let tmp = pv.join(format!(".{i:04}"));
            std::fs::write(&tmp, format!("{version} {i:04}\n")).expect("writing an object");
            chmod(&tmp, 0o644);
            std::fs::rename(&tmp, &file).expect("replacing an object");
        };
        for i in 0..OBJECTS {
            write(i, "v1");
        }
        let all: Vec<String> = (0..OBJECTS).map(path).collect();
        warm(&all);
        let mut client = Client::new(EDGE);
        let cached = all
            .iter()
            .filter(|p| cache_status(&client.get(p)) == "HIT")
            .count();
        if cached < OBJECTS * 99 / 100 {
            return Err(format!("only {cached} of {OBJECTS} objects cached"));
        }
        for i in 0..PURGED {
            write(i, "v2");
        }
        let purges: Vec<wire::Purge> = (0..PURGED)
            .map(|i| wire::Purge {
                id: format!("{NAMESPACE}/burst-{i}/uid/cache/last"),
                paths: vec![path(i)],
                ..wire::Purge::default()
            })
            .collect();
        let started = Instant::now();
        let seen: Mutex<Vec<Option<Duration>>> = Mutex::new(vec![None; PURGED]);
        let applied_at: Mutex<Option<Duration>> = Mutex::new(None);
        let outcome: Result<(Vec<Applied>, Vec<Applied>), String> = std::thread::scope(|s| {
            for t in 0..8 {
                let (seen, applied_at) = (&seen, &applied_at);
                s.spawn(move || {
                    let mut client = Client::new(EDGE);
                    let mine: Vec<usize> = (t..PURGED).step_by(8).collect();
                    let deadline = started + Duration::from_secs(30);
                    while Instant::now() < deadline {
                        let mut left = 0;
                        for &i in &mine {
                            if seen.lock().unwrap()[i].is_some() {
                                continue;
                            }
                            left += 1;
                            let new = client
                                .get(&path(i))
                                .is_ok_and(|r| r.body.starts_with(b"v2"));
                            if new {
                                seen.lock().unwrap()[i] = Some(started.elapsed());
                            }
                        }
                        if left == 0 || applied_at.lock().unwrap().is_some_and(|_| left == 0) {
                            break;
                        }
                    }
                });
            }
            let first = self.purge(setup, &purges[..1])?;
            let rest = self.purge(setup, &purges[1..])?;
            *applied_at.lock().unwrap() = Some(started.elapsed());
            Ok((first, rest))
        });
        let (first, rest) = outcome?;
        let applied = applied_at.into_inner().unwrap().unwrap_or_default();
        let mut times: Vec<f64> = seen
            .into_inner()
            .unwrap()
            .iter()
            .flatten()
            .map(|d| d.as_secs_f64())
            .collect();
        let never = PURGED - times.len();
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let at = |q: f64| {
            times
                .get(((times.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
        };
        let (p50, p99, max) = (at(0.50), at(0.99), times.last().copied());
        // Once applied: no purged object served stale, the others still hits.
        let mut client = Client::new(EDGE);
        let stale = (0..PURGED)
            .filter(|&i| {
                client
                    .get(&path(i))
                    .map_or(true, |r| !r.body.starts_with(b"v2"))
            })
            .count();
        let hits = (PURGED..OBJECTS)
            .filter(|&i| {
                client.get(&path(i)).is_ok_and(|r| {
                    r.header(CACHE_STATUS_HEADER) == Some("HIT") && r.body.starts_with(b"v1")
                })
            })
            .count();
        let invalidated: u64 = first.iter().chain(&rest).flat_map(|a| &a.invalidated).sum();
        let secs = |t: Option<f64>| t.map_or("-".into(), |t| format!("{t:.3} s"));
        Ok(vec![
            figure(
                "16a",
                format!(
                    "{} / {} / {}{} (both batches applied in {:.3} s, {invalidated} objects invalidated)",
                    secs(p50),
                    secs(p99),
                    secs(max),
                    if never > 0 { format!(", {never} never seen new") } else { String::new() },
                    applied.as_secs_f64()
                ),
                Some(never == 0 && p99.is_some_and(|p| p <= 2.0)),
                json!({"p50_s": p50, "p99_s": p99, "max_s": max, "never": never,
                       "applied_s": applied.as_secs_f64(), "invalidated": invalidated,
                       "first_batch": first, "second_batch": rest}),
            ),
            figure(
                "16b",
                format!("{stale} of {PURGED}"),
                Some(stale == 0),
                json!({"stale": stale}),
            ),
            figure(
                "16c",
                format!("{:.1} % ({hits} of {})", 100.0 * hits as f64 / (OBJECTS - PURGED) as f64, OBJECTS - PURGED),
                Some(hits * 100 >= (OBJECTS - PURGED) * 99),
                json!({"hits": hits, "of": OBJECTS - PURGED}),
            ),
        ])
    }

    /// Row 17: 10,000 objects tagged `bulk` and 1,000 tagged `other` (`/pt/TAG/N`, the origin
    /// sends `Surrogate-Key: TAG`) cached through the balancer by 8 threads; one purge of the key
    /// `bulk`, sent to both cache pods at once: the time until both applied it. Then misses among
    /// 500 `bulk` objects, and hits among the `other` ones.
    pub(super) fn row17_purge_by_key(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            ["17a", "17b"]
                .map(|id| figure(id, format!("not measured: {why}"), None, Value::Null))
                .to_vec()
        };
        let plain = match self.with_purging_sidecars(setup) {
            Ok(plain) => plain,
            Err(why) => return not_measured(why),
        };
        let figures = self.purge_by_key(setup).unwrap_or_else(not_measured);
        if self.desired[PODS[1].0].deployment != plain[PODS[1].0].deployment {
            self.apply(setup, plain);
        }
        figures
    }

    fn purge_by_key(&mut self, setup: &Setup) -> Result<Vec<Figure>, String> {
        const BULK: usize = 10_000;
        const OTHER: usize = 1_000;
        let bulk = |i: usize| format!("/pt/bulk/{i:05}");
        let other = |i: usize| format!("/pt/other/{i:04}");
        let all: Vec<String> = (0..BULK).map(bulk).chain((0..OTHER).map(other)).collect();
        std::thread::scope(|s| {
            for part in all.chunks(all.len().div_ceil(8)) {
                s.spawn(move || warm(part));
            }
        });
        let purge = wire::Purge {
            id: format!("{NAMESPACE}/by-key/uid/cache/last"),
            surrogate_keys: vec!["bulk".into()],
            ..wire::Purge::default()
        };
        let started = Instant::now();
        let applied = self.purge(setup, std::slice::from_ref(&purge))?;
        let took = started.elapsed().as_secs_f64();
        let invalidated: u64 = applied.iter().flat_map(|a| &a.invalidated).sum();
        let scanned: u64 = applied.iter().map(|a| a.scanned).sum();
        let by_pod: Vec<u64> = applied.iter().map(|a| a.millis).collect();
        let mut client = Client::new(EDGE);
        let misses = (0..BULK)
            .step_by(BULK / 500)
            .filter(|&i| cache_status(&client.get(&bulk(i))) == "MISS")
            .count();
        let hits = (0..OTHER)
            .filter(|&i| cache_status(&client.get(&other(i))) == "HIT")
            .count();
        Ok(vec![
            figure(
                "17a",
                format!("{took:.3} s ({invalidated} invalidated, {scanned} cache files read, per pod {by_pod:?} ms)"),
                Some(took <= 2.0 && invalidated as usize == BULK),
                json!({"seconds": took, "invalidated": invalidated, "scanned": scanned, "pod_millis": by_pod, "applied": applied}),
            ),
            figure(
                "17b",
                format!("{misses} of 500, {:.1} % ({hits} of {OTHER})", 100.0 * hits as f64 / OTHER as f64),
                Some(misses == 500 && hits * 100 >= OTHER * 99),
                json!({"misses": misses, "hits": hits}),
            ),
        ])
    }
}

/// A number no other batch of this run has.
fn next_batch() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
